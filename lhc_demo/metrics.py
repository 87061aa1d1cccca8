"""Held-out metrics of the demo, in torch alone (the demo needs no scikit-learn).

Why ROC AUC: the clicks are a ranking problem (which items a user clicks), and AUC says how well the
model ranks a clicked pair above an unclicked one whatever the threshold: 0.5 is chance, 1.0 perfect.
"""

from __future__ import annotations

import torch


def roc_auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """The probability that a random positive scores above a random negative, ties counting one half.

    Computed from ranks (the Mann-Whitney U statistic): tied scores share their mean rank, so the result
    equals the pairwise definition exactly, in O(n log n) instead of O(n^2).
    """
    scores, positive = scores.detach().flatten(), labels.detach().flatten() > 0.5
    if scores.numel() != positive.numel():
        raise ValueError(f"{scores.numel()} scores but {positive.numel()} labels")
    n_pos = int(positive.sum())
    n_neg = positive.numel() - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError("ROC AUC needs both positive and negative labels")
    ordered, order = torch.sort(scores)
    _, group, counts = torch.unique_consecutive(ordered, return_inverse=True, return_counts=True)
    last_rank = counts.cumsum(0).to(torch.float64)  # 1-based rank of each tie group's last member
    mean_rank = last_rank - (counts.to(torch.float64) - 1) / 2
    positive_rank_sum = float(mean_rank[group][positive[order]].sum())
    return (positive_rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)
