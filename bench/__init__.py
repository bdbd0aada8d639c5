"""coxswain's benchmarks: ``./dev bench [--quick] [--peer langgraph,dbos]`` (see bench/README.md).

Every figure is measured against a floor measured in the same run on the same servers, and
reported with the ratio to it. Nothing here is a unit test: speed is measured, never asserted.
"""
