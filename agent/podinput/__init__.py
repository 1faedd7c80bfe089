"""What a pod controls, parsed once for both modes (sidecar and ambient).

tokens:  the validated values the rule model holds (interface, port, CIDR, address, id, ...).
grammar: what each kind of pod value may be, text in, tokens out.
pod:     reading a pod manifest's annotations, labels, proxy env and securityContext, and IPs;
         a refused value raises InvalidPodInputError naming the input, with an escaped excerpt.

This package imports neither agent.rules nor agent.ambient: both modes build on it.
"""
