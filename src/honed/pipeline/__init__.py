"""src/honed/pipeline/__init__.py: the tune pipeline behind honed.tune and the JIT mode.

Record, plan, build, check, measure and select: tuner.py drives a tune, graph_tuner.py one graph,
candidate.py one candidate; pool.py and _worker.py run candidates in worker processes; cache.py
keeps results between runs. Nothing here is public API: users reach it through honed.tune.
"""
