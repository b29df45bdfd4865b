"""Workloads: a model plus its deterministic data stream, loss and evaluation.

``registry.build_workload`` builds the one ``train.workload`` names (``gpt.py``, ``classifier.py``, or your own
through ``user.py``). The engine (``launch/engine.py``) only talks to the ``Workload`` protocol (``common.py``):

* ``model`` is a plain ``nn.Module`` built on the CPU from ``cfg.train.seed`` alone; the engine wraps
  it with ``deepspeed.initialize`` and passes the engine back into ``loss``/``evaluate``.
* ``batch(start, count)`` returns samples ``start .. start+count-1`` of an infinite global sample
  stream that depends only on the seed and the data settings. Rank ``r`` at micro-step ``m`` of
  optimizer step ``s`` asks for ``start = s*G + (m*world + r)*mbs`` with ``G = mbs*accum*world``, so an
  optimizer step always consumes samples ``s*G .. (s+1)*G-1`` whatever the split; a resume with another
  micro-batch size, accumulation or world size sees the same data. Tensors are returned on the CPU;
  the engine moves them to its device.
* ``loss(model, batch)`` is the scalar mean training loss, computed in FP32 whatever the model dtype.
* ``evaluate(model)`` returns held-out metrics named ``eval/...``; deterministic, no_grad, and it
  restores the model's training mode.
"""
