"""The agent's doors as fuzz targets for bench/fuzz_doors.py: each module has `SEEDS` (valid
inputs the fuzzer mutates from), `setup()` (run once per process, before fuzzing), `teardown()` and
`one_input(data)`, which raises `Finding` (or lets any unexpected exception out) when the door
misbehaves on `data`. The oracle is each door's contract: only its documented refusals may come
out, and the door still serves afterwards."""
