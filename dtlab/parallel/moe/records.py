"""What a step record says about the experts: the ranks' router counts, added up once.

Each rank reports, per MoE layer it holds, what its router did with the
tokens it read this step (:meth:`dtlab.parallel.moe.layer.MoE.take_stats`). Rank 0
turns the list of every rank's reports into the step line's ``experts``
field (README, "The step record"):

    tokens      [E]   assignments each expert received, all MoE layers together
    routed      [E]   assignments the router gave each expert, before capacity
    dropped     int   assignments over capacity (routed - tokens, summed)
    per_layer   [[E]] ``tokens`` per MoE layer, in model order
    aux_loss    float the balancing terms added to the objective, summed over layers
    balance     float E x sum_i f_i P_i averaged over layers (1.0: perfectly balanced)

Ranks that read the same tokens are counted once: tensor-parallel ranks of
one group all run the same router on the same tokens, so only TP rank 0's
report counts. Pipeline stages hold different layers and data-parallel or
expert-parallel ranks different tokens, so those add up. Plain Python, no torch.
"""

from __future__ import annotations


def expert_summary(ranks: list[dict]) -> dict | None:
    """The ``experts`` field of a step line from each rank's ``{"pp", "tp", "experts": [...]}``;
    removes the ``experts`` reports from ``ranks``. None when no rank has an MoE layer."""
    reports = [(r["pp"], r.pop("experts")) for r in ranks if "experts" in r and r["tp"] == 0]
    for r in ranks:
        r.pop("experts", None)
    layers: dict[tuple[int, int], list[dict]] = {}
    for stage, per_layer in reports:
        for i, layer in enumerate(per_layer):
            layers.setdefault((stage, i), []).append(layer)
    if not layers:
        return None
    per_layer, routed, aux, balance = [], None, 0.0, 0.0
    for key in sorted(layers):
        reps = layers[key]
        kept = [sum(col) for col in zip(*(r["kept"] for r in reps))]
        chosen = [sum(col) for col in zip(*(r["routed"] for r in reps))]
        per_layer.append(kept)
        routed = chosen if routed is None else [a + b for a, b in zip(routed, chosen)]
        aux += sum(r["aux_loss"] for r in reps) / len(reps)  # mean over the data ranks
        balance += sum(r["balance"] for r in reps) / len(reps)
    tokens = [sum(col) for col in zip(*per_layer)]
    return {
        "tokens": tokens,
        "routed": routed,
        "dropped": sum(routed) - sum(tokens),
        "per_layer": per_layer,
        "aux_loss": aux,
        "balance": balance / len(per_layer),
    }
