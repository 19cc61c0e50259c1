"""A whole recurrent layer traced on the meta device: its results come from the shapes alone (run step
by step through Python meta functions, KernelBench's 6-layer, 512-step GRU took 16 s to trace), and
they are the shapes, strides and dtypes PyTorch's own run gives, in every padded form nn.LSTM/GRU/RNN call."""

import pytest
import torch
from torch import nn

from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from cuforge.op_trace import LiteralCapture, OpRecorder, recurrent_on_meta


class Dispatched(TorchDispatchMode):
    """Counts every aten op dispatched beneath it, those the recorder runs and then drops included."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.count += 1
        return func(*args, **(kwargs or {}))

FORMS = {  # the layer, its forward's arguments
    "lstm_batch_first": (lambda: nn.LSTM(12, 16, 2, batch_first=True),
                         lambda: (torch.randn(3, 5, 12), (torch.randn(2, 3, 16), torch.randn(2, 3, 16)))),
    "lstm_projected_bidirectional": (lambda: nn.LSTM(12, 16, 2, proj_size=8, bidirectional=True),
                                     lambda: (torch.randn(5, 3, 12), (torch.randn(4, 3, 8), torch.randn(4, 3, 16)))),
    "lstm_unbatched": (lambda: nn.LSTM(12, 16, 1), lambda: (torch.randn(5, 12),)),
    "gru_batch_first_bidirectional": (lambda: nn.GRU(12, 16, 2, batch_first=True, bidirectional=True),
                                      lambda: (torch.randn(3, 5, 12), torch.randn(4, 3, 16))),
    "gru_unbatched": (lambda: nn.GRU(12, 16, 3), lambda: (torch.randn(5, 12),)),
    "rnn_relu": (lambda: nn.RNN(12, 16, 1, nonlinearity="relu"), lambda: (torch.randn(5, 3, 12),)),
    "rnn_tanh_bidirectional_float64": (lambda: nn.RNN(12, 16, 2, bidirectional=True).double(),
                                       lambda: (torch.randn(5, 3, 12, dtype=torch.float64),)),
}


def flat(out) -> list[torch.Tensor]:
    first, rest = out
    return [first, *(rest if isinstance(rest, tuple) else (rest,))]


@pytest.mark.parametrize("form", FORMS)
def test_a_layer_traced_on_meta_has_pytorchs_shapes_without_running_its_steps(form):
    layer, inputs = FORMS[form]
    torch.manual_seed(0)
    model = layer()
    with torch.no_grad():
        real = flat(model(*inputs()))
    model = model.to("meta")
    with torch.device("meta"):
        args = inputs()
    stepped = FlopCounterMode(display=False)  # PyTorch's own count, its meta functions stepping through
    with torch.no_grad(), stepped:
        model(*args)
    recorder, dispatched = OpRecorder(graph=True), Dispatched()
    recorder.name_tensors("in", list(args))
    with torch.no_grad(), dispatched, recorder, LiteralCapture(recorder):
        traced = flat(model(*args))
    assert [(t.shape, t.stride(), t.dtype, t.device.type) for t in traced] == \
        [(r.shape, r.stride(), r.dtype, "meta") for r in real]
    layer_ops = [op for op in recorder.ops if op in ("lstm", "gru", "rnn_tanh", "rnn_relu")]
    assert layer_ops == [form.split("_")[0] if not form.startswith("rnn") else "_".join(form.split("_")[:2])]
    # none of its steps ran: the few ops dispatched are the layer's own setup (zeros for a missing
    # hidden state, squeeze for an unbatched input); stepped through, each step is several ops
    assert dispatched.count <= 12, dispatched.count
    # the FLOPs the steps would have counted are the recorder's to add
    assert recorder.uncounted_flops == stepped.get_total_flops() > 0


def test_other_forms_and_devices_run_as_they_are():
    x, h = torch.randn(5, 3, 12, device="meta"), torch.randn(1, 3, 16, device="meta")
    params = [torch.randn(48, 12, device="meta")]
    padded = (x, h, params, False, 1, 0.0, False, False, False)
    assert recurrent_on_meta("gru", padded, {}) is not None
    # the packed-sequence form: (data, batch_sizes, hx, params, ...)
    packed = (x.reshape(15, 12), torch.tensor([3] * 5), h, params, False, 1, 0.0, False, False)
    assert recurrent_on_meta("gru", packed, {}) is None
    assert recurrent_on_meta("lstm", (x, [h, h], params, *padded[3:]), {}) is not None
    assert recurrent_on_meta("lstm", (x.reshape(15, 12), torch.tensor([3] * 5), [h, h], params, *padded[4:]), {}) is None
    # on the CPU the layer runs for real: its values are the reference's
    cpu = (torch.randn(5, 3, 12), torch.randn(1, 3, 16), [torch.randn(48, 12)], *padded[3:])
    assert recurrent_on_meta("gru", cpu, {}) is None
