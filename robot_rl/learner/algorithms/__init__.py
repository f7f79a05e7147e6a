"""Learning algorithms the trainer can run, chosen by ``learner/algorithm=NAME``.

``config`` holds each algorithm's settings and the ``ALGORITHMS`` registry (no torch);
``ALGORITHMS.build(config, policy, trainer_config, device)`` imports and makes the algorithm
a config names. The classes live in ``bc``, ``rwr``, ``awr`` and ``rl``; this package imports
none of them, so reading a config never imports torch.
"""
