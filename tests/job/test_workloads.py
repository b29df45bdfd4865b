"""The two workloads of the training job (gpt, classifier) and their deterministic sample streams."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hpc_agent.config.load import build_config, load_config
from launch.workloads import sampling
from launch.workloads.common import Workload
from launch.workloads.gpt import ByteGPT, gpt_param_count
from launch.workloads.registry import build_workload

SMALL_GPT = {"n_layers": 2, "d_model": 64, "n_heads": 4, "seq_len": 32}
SMALL_DATA = {"num_samples": 3000, "num_features": 16}
METHODS = ["none", "class_weight", "weighted_sampler", "mixup", "smote"]


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread, and the test machine's cores are shared."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def gpt_cfg(seed: int = 1234, checkpointing: bool = False, **model):
    return build_config([{"train": {"workload": "gpt", "seed": seed, "activation_checkpointing": checkpointing},
                          "model": {**SMALL_GPT, **model}}])


def clf_cfg(method: str = "none", seed: int = 1234, **data):
    return build_config([{"train": {"workload": "classifier", "seed": seed},
                          "data": {**SMALL_DATA, "imbalance_method": method, **data}}])


# Every stream kind: the gpt windows and each classifier method (they use different stream types).
STREAM_CASES = {"gpt": lambda seed: gpt_cfg(seed)} | {
    f"classifier-{m}": (lambda m: lambda seed: clf_cfg(m, seed))(m) for m in METHODS}


def assert_batches_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


# ---------------------------------------------------------------- the stream contract
@pytest.mark.parametrize("case", list(STREAM_CASES))
def test_batch_is_a_pure_function_of_the_sample_range(case):
    build = STREAM_CASES[case]
    first, again = build_workload(build(7)), build_workload(build(7))
    assert isinstance(first, Workload)
    # Same (start, count) -> same tensors, from the same object and from a fresh build.
    assert_batches_equal(first.batch(100, 8), first.batch(100, 8))
    assert_batches_equal(first.batch(100, 8), again.batch(100, 8))
    # Splitting a range does not change it.
    whole = first.batch(0, 8)
    halves = [first.batch(0, 4), first.batch(4, 4)]
    assert_batches_equal(whole, {k: torch.cat([h[k] for h in halves]) for k in whole})
    # The model is deterministic given the seed too.
    for p, q in zip(first.model.state_dict().values(), again.model.state_dict().values()):
        assert torch.equal(p, q)
    # Another seed: other data order and other initial weights.
    other = build_workload(build(8))
    assert not all(torch.equal(whole[k], other.batch(0, 8)[k]) for k in whole)
    assert not all(torch.equal(p, q) for p, q in zip(first.model.parameters(), other.model.parameters()))


@pytest.mark.parametrize("mbs,accum,world", [(8, 1, 1), (4, 2, 1), (2, 2, 2), (1, 4, 2), (2, 1, 4)])
def test_every_split_of_a_step_reads_the_same_samples(mbs, accum, world):
    """The engine's addressing (start = s*G + (m*world + r)*mbs) covers samples s*G .. (s+1)*G-1."""
    workload = build_workload(gpt_cfg())
    global_batch, step = 8, 3
    assert mbs * accum * world == global_batch
    parts = [workload.batch(step * global_batch + (m * world + r) * mbs, mbs)
             for m in range(accum) for r in range(world)]
    reference = workload.batch(step * global_batch, global_batch)
    assert_batches_equal(reference, {k: torch.cat([p[k] for p in parts]) for k in reference})


def test_chunked_stream_crosses_chunk_boundaries_and_epochs():
    stream = sampling.shuffled_epochs(10, seed=3)
    epochs = stream.take(0, 30)["index"]
    for e in range(3):
        assert sorted(epochs[10 * e:10 * e + 10]) == list(range(10))  # each epoch is a permutation
    assert not np.array_equal(epochs[:10], epochs[10:20])  # ... a different one each epoch
    assert np.array_equal(stream.take(7, 9)["index"], epochs[7:16])
    assert np.array_equal(sampling.shuffled_epochs(10, seed=3).take(25, 5)["index"], epochs[25:30])
    assert stream.take(4, 0)["index"].shape == (0,)


def test_weighted_draws_follow_the_probabilities():
    labels = np.array([0] * 900 + [1] * 90 + [2] * 10)
    drawn = sampling.weighted_draws(sampling.balanced_class_probs(labels), seed=1, chunk_size=1000).take(0, 6000)
    shares = np.bincount(labels[drawn["index"]], minlength=3) / 6000
    assert np.allclose(shares, 1 / 3, atol=0.03)


# ---------------------------------------------------------------- gpt
def test_gpt_parameter_counts():
    small = build_workload(gpt_cfg(n_layers=4, d_model=128, n_heads=4, seq_len=64))
    n_small = sum(p.numel() for p in small.model.parameters())
    assert n_small == gpt_param_count(4, 128, 64)
    assert 0.5e6 < n_small < 1.5e6
    # The documented ~350M config, instantiated on the meta device (no memory is allocated).
    m = load_config("configs/gpt350m.yaml").model
    with torch.device("meta"):
        big = ByteGPT(m.n_layers, m.d_model, m.n_heads, m.seq_len)
    n_big = sum(p.numel() for p in big.parameters())
    assert n_big == gpt_param_count(m.n_layers, m.d_model, m.seq_len)
    assert 330e6 < n_big < 370e6


def test_gpt_loss_decreases_with_plain_training():
    torch.manual_seed(0)
    workload = build_workload(gpt_cfg())
    model = workload.model
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    before = workload.evaluate(model)["eval/loss"]
    losses = []
    for step in range(30):
        loss = workload.loss(model, workload.batch(step * 16, 16))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(math.log(256), abs=0.3)  # uniform over bytes at init
    assert np.mean(losses[-5:]) < losses[0] - 1.0
    after = workload.evaluate(model)
    assert after["eval/loss"] < before - 1.0
    assert after["eval/bits_per_byte"] == pytest.approx(after["eval/loss"] / math.log(2))
    assert model.training  # evaluate restores the training mode
    assert workload.evaluate(model) == after  # deterministic


def _forward_backward(workload, batch):
    """Loss, gradients, number of tensors saved for backward and number of block forward calls."""
    saved, calls = [0], [0]
    # A pre-hook: non-reentrant checkpointing stops the recomputation early, once it has rebuilt
    # the tensors backward needs, so a block's post-forward hook need not fire the second time.
    hooks = [block.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
             for block in workload.model.blocks]

    def pack(tensor):
        saved[0] += 1
        return tensor

    torch.manual_seed(0)  # same dropout masks in both runs
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = workload.loss(workload.model, batch)
    workload.model.zero_grad()
    loss.backward()
    for hook in hooks:
        hook.remove()
    grads = {name: p.grad.clone() for name, p in workload.model.named_parameters()}
    return loss, grads, saved[0], calls[0]


def test_activation_checkpointing_is_on_per_block_and_changes_nothing_numerically():
    plain = build_workload(gpt_cfg(dropout=0.1))
    ckpt = build_workload(gpt_cfg(dropout=0.1, checkpointing=True))
    assert not plain.model.activation_checkpointing and ckpt.model.activation_checkpointing
    batch = plain.batch(0, 4)
    loss_a, grads_a, saved_a, calls_a = _forward_backward(plain, batch)
    loss_b, grads_b, saved_b, calls_b = _forward_backward(ckpt, batch)
    n_blocks = len(plain.model.blocks)
    assert calls_a == n_blocks and calls_b == 2 * n_blocks  # each block is recomputed in backward
    assert saved_b < saved_a / 2  # only block inputs are kept, not every intermediate
    assert torch.allclose(loss_a, loss_b, rtol=0, atol=1e-6)
    for name in grads_a:
        assert torch.allclose(grads_a[name], grads_b[name], rtol=1e-5, atol=1e-7), name


def test_gpt_draws_positions_uniformly_when_the_text_is_too_big_to_permute(monkeypatch):
    import launch.workloads.gpt as gpt

    monkeypatch.setattr(gpt, "MAX_PERMUTED_POSITIONS", 1000)
    workload = build_workload(gpt_cfg())
    assert workload.stream.chunk_size != workload.n_train - workload.seq_len  # not the epoch permutation
    starts = workload.stream.take(0, 5000)["index"]
    assert starts.min() >= 0 and starts.max() + workload.seq_len + 1 <= workload.n_train  # never reads held-out bytes
    assert_batches_equal(workload.batch(70000, 6), build_workload(gpt_cfg()).batch(70000, 6))


def test_gpt_reads_a_given_text_file(tmp_path):
    path = tmp_path / "text.txt"
    path.write_bytes(bytes(range(256)) * 8)
    workload = build_workload(build_config([{"train": {"workload": "gpt"}, "model": SMALL_GPT,
                                             "data": {"path": str(path)}}]))
    batch = workload.batch(0, 3)
    # Byte i is followed by byte i+1 in this text: labels are the inputs shifted by one.
    assert torch.equal(batch["labels"], (batch["input_ids"] + 1) % 256)
    too_short = tmp_path / "short.txt"
    too_short.write_bytes(b"abc")
    with pytest.raises(ValueError, match="too short"):
        build_workload(build_config([{"train": {"workload": "gpt"}, "model": SMALL_GPT,
                                      "data": {"path": str(too_short)}}]))


# ---------------------------------------------------------------- both, as the engine runs them
@pytest.mark.parametrize("case", ["gpt", "classifier-none", "classifier-class_weight", "classifier-mixup"])
def test_loss_works_on_a_bf16_model_and_stays_fp32(case):
    workload = build_workload(STREAM_CASES[case](1))
    model = workload.model.to(torch.bfloat16)  # what the engine does under BF16
    loss = workload.loss(model, workload.batch(0, 4))
    assert loss.dtype == torch.float32 and loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    metrics = workload.evaluate(model)
    assert all(math.isfinite(v) for v in metrics.values())


# ---------------------------------------------------------------- classifier
def test_default_generated_data_is_at_least_1_to_50_and_split_stratified():
    cfg = build_config([{"train": {"workload": "classifier"}}])
    workload = build_workload(cfg)
    train = np.bincount(workload.y_train.numpy())
    held = np.bincount(workload.y_eval.numpy())
    assert len(train) == cfg.data.num_classes and workload.x_train.shape[1] == cfg.data.num_features
    assert abs(train.sum() - cfg.data.num_samples) <= cfg.data.num_classes
    assert train.max() / train.min() >= 50
    assert np.allclose(held / held.sum(), train / train.sum(), atol=0.01)  # same class shares


@pytest.mark.parametrize("method", METHODS)
def test_each_imbalance_method_builds_and_trains_a_step(method):
    workload = build_workload(clf_cfg(method))
    model = workload.model
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batch = workload.batch(0, 32)
    loss = workload.loss(model, batch)
    assert loss.ndim == 0 and torch.isfinite(loss)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    metrics = workload.evaluate(model)
    assert set(metrics) >= {"eval/loss", "eval/macro_f1", "eval/balanced_accuracy"}
    assert 0 <= metrics["eval/balanced_accuracy"] <= 1 and 0 <= metrics["eval/macro_f1"] <= 1
    assert workload.tokens_per_sample == 1


def test_smote_balances_the_training_classes():
    original = np.bincount(build_workload(clf_cfg("none")).y_train.numpy())
    resampled = np.bincount(build_workload(clf_cfg("smote")).y_train.numpy())
    assert original.max() / original.min() >= 50
    assert (resampled == original.max()).all()


@pytest.mark.parametrize("method", ["weighted_sampler", "mixup"])
def test_balanced_streams_draw_every_class_about_equally(method):
    workload = build_workload(clf_cfg(method))
    labels = workload.batch(0, 5000)["y"].numpy()
    shares = np.bincount(labels, minlength=workload.num_classes) / len(labels)
    assert np.allclose(shares, 1 / workload.num_classes, atol=0.03)


def test_mixup_targets_are_convex_mixtures():
    workload = build_workload(clf_cfg("mixup"))
    batch = workload.batch(0, 256)
    soft = batch["y_soft"]
    assert torch.allclose(soft.sum(dim=1), torch.ones(256))
    assert (soft >= 0).all()
    # The base label keeps weight lambda, partner's 1 - lambda; the Beta(0.4, 0.4) lambdas spread out.
    base_weight = soft.gather(1, batch["y"][:, None]).squeeze(1)
    assert base_weight.min() < 0.6 and base_weight.max() > 0.9


def test_class_weights_are_inverse_frequency():
    workload = build_workload(clf_cfg("class_weight"))
    counts = torch.as_tensor(workload.train_class_counts, dtype=torch.float32)
    products = workload.class_weights * counts
    assert torch.allclose(products, products[0].expand_as(products))
    # Normalised so that a batch with the training class mix has an average weight of 1.
    assert (workload.class_weights * counts).sum() / counts.sum() == pytest.approx(1.0)


def test_classifier_reads_a_csv_with_any_integer_labels(tmp_path):
    rng = np.random.default_rng(0)
    rows = [f"{a:.4f},{b:.4f},{label}" for a, b, label in
            zip(rng.normal(size=200), rng.normal(size=200), rng.choice([3, 7, 9], size=200, p=[0.7, 0.2, 0.1]))]
    path = tmp_path / "data.csv"
    path.write_text("f1,f2,label\n" + "\n".join(rows) + "\n")
    workload = build_workload(clf_cfg("class_weight", path=str(path)))
    assert workload.num_classes == 3 and workload.x_train.shape[1] == 2
    assert len(workload.y_train) + len(workload.y_eval) == 200
    assert set(workload.y_eval.tolist()) == {0, 1, 2}  # stratified: every class is held out too
    workload.loss(workload.model, workload.batch(0, 8)).backward()
