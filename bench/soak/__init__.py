"""A long soak of the agent under every fault at once (`python -m bench.soak`).

One job a module: `faults` (the catalogue and the Fault protocol), `actions` (each kind's
fault on the test bed's parts), `schedule` (the seeded timeline of fault windows), `invariants`
(what must hold, each violation with the faults active then), `trend` (resource slopes over the
run), `procstats` (an agent process's RSS, threads and descriptors), `report` (markdown, plot,
the JSON line), `bed` (what the run needs of a test bed), `run` (the loop), `__main__` (the CLI).
"""
