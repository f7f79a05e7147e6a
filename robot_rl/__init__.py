"""robot_rl: real-robot asynchronous VLA learning.

Subpackages: ``core`` (data types and clocks, imports nothing of the project),
``edge`` (the robot-side runtime), ``learner`` (the training service), ``bench``
(benchmarks behind ``robot-rl bench``), and ``cli``.
"""

__version__ = "0.1.0"
