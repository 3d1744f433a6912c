"""Restoration arithmetic: which increases a cancelled order's lines may apply.

Pure: takes the lines and a snapshot of the inventory rows (soft-deleted ones included) and
decides. The caller persists the decision; nothing here is ever saved directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# The stock column is a 32-bit integer: an increase past this would fail in the database
# halfway through a restore, so it is refused up front, before anything is written.
MAX_ON_HAND = 2_147_483_647


@dataclass(frozen=True)
class RestorationPlan:
    increases: dict[int, int] = field(default_factory=dict)  # variant_id -> quantity to add back
    unmatched: dict[int, int] = field(default_factory=dict)  # variant_id -> quantity with no inventory row
    refusals: tuple[str, ...] = ()  # invariant codes; non-empty = apply nothing

    @property
    def refused(self) -> bool:
        return bool(self.refusals)


def plan_restoration(lines, on_hand: dict[int, int]) -> RestorationPlan:
    """`lines` is an iterable of (variant_id, quantity); `on_hand` maps the variant ids that have
    an inventory row (deleted or not) to their current quantity."""
    wanted: dict[int, int] = {}
    for variant_id, quantity in lines:
        wanted[variant_id] = wanted.get(variant_id, 0) + quantity

    increases, unmatched, refusals = {}, {}, []
    for variant_id in sorted(wanted):
        quantity = wanted[variant_id]
        if quantity <= 0:
            refusals.append(f"non_positive_quantity:variant={variant_id}")
            continue
        if variant_id not in on_hand:
            unmatched[variant_id] = quantity
            continue
        if on_hand[variant_id] + quantity > MAX_ON_HAND:
            refusals.append(f"stock_would_overflow:variant={variant_id}")
            continue
        increases[variant_id] = quantity
    return RestorationPlan(increases, unmatched, tuple(refusals))
