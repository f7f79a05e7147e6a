"""The learner's sampling streams: steps the policy acted in on its own (``online``), the operator's
takeovers (``intervention``) and the scripted expert's demonstrations (``demonstration``). Batches
mix them in the trainer's ratios; the algorithms weight and bound each one by name."""

STREAMS = ("online", "intervention", "demonstration")
