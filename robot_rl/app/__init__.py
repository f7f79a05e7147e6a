"""What the commands and the benchmarks share: the main job, the synchronous baseline,
demonstrations, behaviour cloning and evaluation. ``robot_rl.commands`` parses and calls these;
``robot_rl.bench`` measures them."""
