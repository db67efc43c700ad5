"""Evaluations: what a case's answer must satisfy (`checking`), the judge of rubric cases (`judging`), and the score.

Shared by whoever runs cases (`rockbot eval run` with `rockbot local`) and by whoever turns recorded runs
into cases (`rockbot eval from-runs`): one reading of a case, wherever it runs.
"""
