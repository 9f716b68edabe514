"""A FROZEN copy of the policy layer (engine/scheduler.py, request.py, block_manager.py as of commit dd524d5),
kept as the oracle of tests/test_policy_equivalence.py: the live policy layer may get faster, but every plan,
preemption, block id and token it produces must stay identical to this copy's. Do not edit these files to
make the test pass; a deliberate behaviour change replaces the copy in the same commit, saying why.
"""
