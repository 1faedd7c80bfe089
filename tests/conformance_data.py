"""Where Istio's conformance cases live: the project's own copy, tests/testdata/istio-conformance.

The copy (origin and licence in its README.md and LICENSE.istio) is what every test reads, so a
clone of the project alone passes its tests; `ci/check-conformance-copy` keeps it equal to the
shared conformance set it was taken from.
"""

from __future__ import annotations

from pathlib import Path

CONFORMANCE_DIR = Path(__file__).resolve().parent / "testdata" / "istio-conformance"

AMBIENT_DIR = CONFORMANCE_DIR / "ambient"
"""Ambient cases: the shared sample plus the rest of Istio's goldens (ambient/ORIGIN.md)."""
