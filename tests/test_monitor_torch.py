"""`bnfix.torch.monitor` from Python: what it records, that it does not change the training it
watches (same weights and running statistics as an unwatched run), that its probe leaves the
running statistics alone, and that closing it removes its hooks."""

from __future__ import annotations

import sys

import pytest
from conftest import FIXTURES

torch = pytest.importorskip("torch")
sys.path.insert(0, str(FIXTURES / "doctor"))
from torch_train import make_data, make_model

from bnfix.doctor.record import Recording
from bnfix.torch import monitor


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models: more threads only contend (and make the timing depend on the machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _train(model, steps: int, batch: int = 32, evaluate: bool = False) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    images, labels = make_data(512, seed=1)
    g = torch.Generator().manual_seed(2)
    model.train()
    for _ in range(steps):
        index = torch.randint(0, len(images), (batch,), generator=g)
        loss = torch.nn.functional.cross_entropy(model(images[index]), labels[index])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if evaluate:
        with torch.no_grad():
            model(images[:64])


def _model():
    torch.manual_seed(0)
    return make_model(momentum=0.1)


def test_records_every_k_steps_with_counts_grads_and_paths():
    model = _model()
    with monitor(model, every=5) as watcher:
        _train(model, 23)
    rec = watcher.recording
    assert rec.framework == "torch" and rec.steps == 23 and set(rec.layers) == {"bn1", "bn2", "bn3"}
    bn1, bn3 = rec.layers["bn1"], rec.layers["bn3"]
    assert [s.step for s in bn1.samples] == [1, 6, 11, 16, 21]
    assert {(s.count, s.batch) for s in bn1.samples} == {(32 * 8 * 8, 32)}
    assert {(s.count, s.batch) for s in bn3.samples} == {(32, 32)}
    first = bn1.samples[0]
    assert first.running_mean == 0.0 and first.running_var == 1.0  # before the first update
    assert first.gamma_grad > 0 and first.beta_grad > 0 and 0 <= first.dead <= 1
    assert all(s.gamma_step is not None and 0 < s.gamma_path <= 1 for s in bn1.samples[:-1])
    assert bn1.updates == 23 and bn1.momentum == 0.1 and bn1.final.window == 5
    assert len(bn1.final.running_mean) == 16 and bn1.probes and rec.output_gap
    assert Recording.from_data(rec.to_data()).to_data() == rec.to_data()


def test_the_monitor_does_not_change_the_training():
    plain, watched = _model(), _model()
    _train(plain, 12)
    with monitor(watched, every=2, probe_every=1):
        _train(watched, 12)
    for (name, a), (_, b) in zip(plain.state_dict().items(), watched.state_dict().items()):
        assert torch.equal(a, b), name


def test_closing_removes_every_hook():
    model = _model()
    watcher = monitor(model, every=1)
    _train(model, 2)
    watcher.close()
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    assert not any(p._post_accumulate_grad_hooks for p in model.parameters())


def test_evaluation_in_train_mode_and_eval_mode_training_are_noted():
    model = _model()
    with monitor(model, every=5) as watcher:
        model.bn2.eval()  # γ/β still train
        _train(model, 6, evaluate=True)  # _train calls model.train(): undo for bn2 each step
    # _train's model.train() put bn2 back in train mode: the no_grad forward updates it
    rec = watcher.recording
    assert rec.layers["bn1"].eval_updates == 1 and rec.layers["bn1"].eval_update_steps == [[6, 6]]
    found = {f.code for f in watcher.diagnose()}
    assert "BN304" in found


def test_a_layer_in_eval_mode_is_not_probed_as_if_training():
    model = _model()
    with monitor(model, every=5) as watcher:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        images, labels = make_data(64, seed=1)
        model.train()
        model.bn1.eval()
        for _ in range(5):
            loss = torch.nn.functional.cross_entropy(model(images[:32]), labels[:32])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    trace = watcher.recording.layers["bn1"]
    assert trace.eval_mode_steps == [[1, 5]] and trace.updates == 0
    assert [f.code for f in watcher.diagnose() if f.layer == "bn1"] == ["BN305"]
    assert model.bn1.training is False and model.bn2.training is True  # modes restored


def test_every_must_be_positive():
    with pytest.raises(ValueError, match="every must be at least 1"):
        monitor(_model(), every=0)


def test_a_half_precision_bn_near_float16_range_is_diagnosed():
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)).half()  # statistics in fp16
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with monitor(model, every=1) as watcher:
        for _ in range(3):
            x = (torch.randn(16, 3, 8, 8) * 300).half()  # variances ~4e4 of fp16's 65504
            loss = model(x).float().square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    trace = watcher.recording.layers["1"]
    assert (trace.dtype, trace.input_dtype) == ("float16", "float16")
    assert all(s.var_max > 30000 for s in trace.samples)
    assert "BN309" in {f.code for f in watcher.diagnose()}
