"""The maths: what the SDE is, the state, the sensitivity, the solvers and the step, noise, schedules, history.

Every function here is pure and transformable by ``torch.func``; nothing here loops over a run.
"""
