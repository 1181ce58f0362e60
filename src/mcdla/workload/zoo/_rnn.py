"""Analytical builders of the recurrent workloads: ``rnn``, ``lstm``, ``gru`` stacks and the ``seq-lstm``
encoder-decoder.

NOTE [recurrent granularity]
A recurrent layer ``<prefix>`` is split into leaf modules that are meaningful units of offloading:

* ``<prefix>.ih`` -- one Linear applying the input weights to the whole sequence at once (the
  "pre-computed input" GEMM of cuDNN and PyTorch's CPU RNN); it saves the layer's input sequence;
* ``<prefix>.steps.<k>`` -- the recurrence over ``chunk`` consecutive timesteps (the last chunk may be
  shorter); ``steps.0`` owns the recurrent weight ``weight_hh`` (gates*hidden x hidden) and ``bias_hh``,
  and later chunks use it. Each chunk saves what its timesteps' backward needs.

Backward runs the chunks in reverse order, so a chunk's saved tensors are needed exactly when BPTT reaches
it: offloading chunk k and prefetching it during chunk k+1's backward is the natural schedule. Weights are
read once per layer (persistent-kernel assumption: the recurrent weight stays on chip across timesteps).

Per timestep (hidden H, batch N, tensors N x H unless said) PyTorch autograd saves, for the cells written
in :mod:`mcdla.profile.models`:

* vanilla (``h' = tanh(x W_ih + b_ih + h W_hh^T + b_hh)``): ``h`` (by addmm) and ``h'`` (by tanh);
* LSTM: ``h``, ``c``, the four activated gates and ``tanh(c')``: 7 tensors;
* GRU (PyTorch's formulation, ``h' = lerp(n, h, z)``): ``h``, ``r``, ``z``, ``n`` and the whole N x 3H
  recurrent product (kept alive by the ``r * (h W_hn^T + b_hn)`` view): 7 N x H.
"""

from __future__ import annotations

from mcdla.workload.model import LayerKind
from mcdla.workload.zoo._graph import _INT64_BYTES, _Graph, _T
from mcdla.workload.zoo.specs import GATES, chunk_lengths

__all__: list[str] = []


def _step(g: _Graph, name: str, cell: str, h: _T, c: _T | None, hidden: int) -> tuple[_T, _T | None, list[_T]]:
    """One timestep inside chunk ``name``: the new (h, c) and the tensors this step saves."""
    n = h.shape[0]

    def fresh(features: int = hidden) -> _T:
        return g.new((n, features), producer=name, requires_grad=True)

    if cell == "rnn":
        h_new = fresh()
        return h_new, None, [h, h_new]
    if cell == "lstm":
        assert c is not None
        gates = [fresh() for _ in range(4)]
        tanh_c = fresh()
        c_new, h_new = fresh(), fresh()
        return h_new, c_new, [h, c, *gates, tanh_c]
    gh = fresh(3 * hidden)
    r, z, cand = fresh(), fresh(), fresh()
    return fresh(), None, [h, gh, r, z, cand]


def _recurrent_layer(
    g: _Graph, prefix: str, cell: str, x: _T, hidden: int, chunk: int, state: tuple[_T, _T | None] | None = None
) -> tuple[_T, tuple[_T, _T | None]]:
    """Layer ``prefix`` over ``x`` of shape (T, N, I): returns the stacked output (T, N, H) and the final state."""
    seq_len, batch, _ = x.shape
    gated = GATES[cell] * hidden
    gx = g.linear(f"{prefix}.ih", x, gated)
    if state is None:
        h = g.new((batch, hidden), producer=None, requires_grad=False)
        c = g.new((batch, hidden), producer=None, requires_grad=False) if cell == "lstm" else None
    else:
        h, c = state
    hs: list[_T] = []
    for k, length in enumerate(chunk_lengths(seq_len, chunk)):
        name = f"{prefix}.steps.{k}"
        reads = (g.view(gx, (length, batch, gated)), h) + ((c,) if c is not None else ())
        saves: list[_T] = []
        outputs: list[_T] = []
        fwd_flops = bwd_flops = 0.0
        for _ in range(length):
            step_flops = 2.0 * batch * hidden * gated
            fwd_flops += step_flops
            bwd_flops += step_flops * (2 if h.requires_grad else 1)
            h, c, step_saves = _step(g, name, cell, h, c, hidden)
            saves += step_saves
            outputs.append(h)
        params = (gated * hidden + gated) * g.elt_bytes if k == 0 else 0.0
        g.layer(
            name,
            LayerKind.RNN_CELL,
            reads=reads,
            outputs=tuple(outputs) + ((c,) if c is not None else ()),
            saves=tuple(saves),
            param_bytes=params,
            fwd_flops=fwd_flops,
            bwd_flops=bwd_flops,
        )
        hs += outputs
    return g.glue(tuple(hs), (seq_len, batch, hidden)), (h, c)


def recurrent_stack(
    cell: str,
    g: _Graph,
    batch: int,
    *,
    hidden: int,
    seq_len: int,
    layers: int,
    input_size: int,
    num_classes: int,
    chunk: int,
) -> None:
    """``layers`` stacked recurrent layers over (seq_len, batch, input_size) features, then a per-timestep
    classifier ``fc`` and ``log_softmax`` (framewise NLL loss)."""
    x = g.input((seq_len, batch, input_size))
    for layer in range(layers):
        x, _ = _recurrent_layer(g, f"layers.{layer}", cell, x, hidden, chunk)
    g.log_softmax("log_softmax", g.linear("fc", x, num_classes))


def seq2seq(
    g: _Graph,
    batch: int,
    *,
    hidden: int,
    embed: int,
    layers: int,
    seq_len: int,
    src_vocab: int,
    tgt_vocab: int,
    chunk: int,
) -> None:
    """Sutskever et al. 2014: an LSTM encoder and decoder of ``layers`` layers each; decoder layer l starts
    from encoder layer l's final (h, c); teacher forcing; softmax over the target vocabulary (``proj``)."""
    src = g.input((seq_len, batch), elt_bytes=_INT64_BYTES)
    tgt = g.input((seq_len, batch), elt_bytes=_INT64_BYTES)
    x = g.embedding("encoder.embed", src, src_vocab, embed)
    states = []
    for layer in range(layers):
        x, state = _recurrent_layer(g, f"encoder.layers.{layer}", "lstm", x, hidden, chunk)
        states.append(state)
    y = g.embedding("decoder.embed", tgt, tgt_vocab, embed)
    for layer in range(layers):
        y, _ = _recurrent_layer(g, f"decoder.layers.{layer}", "lstm", y, hidden, chunk, states[layer])
    g.log_softmax("log_softmax", g.linear("proj", y, tgt_vocab))
