"""A random trace of the order saga's model (model/saga.pml) as steps for
tests/model/test_model_conformance.py: spin's `STEP <order> <action> [arguments]` lines, each with
the `STATE <on hand> <state> <marker> <refund rows> <provider refunds>` its printf prints, the
model's order state read as the store's (shop.domain.order.OrderStatus)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from model_support import model_text, simulate
from shop.domain.order import OrderStatus

ORDERS, SESSIONS, SIM_STEPS = 2, 2, 400
# The model's order states (saga.pml: NONE, PENDING, ... REJECTED) and the store's.
MODEL_STATES = {
    0: None,
    1: OrderStatus.PENDING_PAYMENT,
    2: OrderStatus.PAYMENT_INITIATED,
    3: OrderStatus.PAID,
    4: OrderStatus.PAYMENT_FAILED,
    5: OrderStatus.CANCELLED,
    6: "rejected",
}
STEP_LINE = re.compile(r"^STEP (\d) (\w+)((?: -?\d+)*)\nSTATE (-?\d+) (\d+) (\d+) (\d+) (\d+)$", re.MULTILINE)


@dataclass
class Step:
    order: int
    action: str
    args: tuple[int, ...]
    on_hand: int
    state: tuple  # (status, marker, refund rows, provider refunds) of the order


def trace_of(stock: int, seed: int, workdir) -> list[Step]:
    output = simulate(model_text(), {"N": ORDERS, "STOCK": stock, "MAXS": SESSIONS}, seed, SIM_STEPS, workdir)
    assert "assertion violated" not in output and "Error:" not in output, output[-3000:]
    steps = [
        Step(
            int(o), action, tuple(int(a) for a in args.split()), int(h), (MODEL_STATES[int(s)], int(m), int(r), int(p))
        )
        for o, action, args, h, s, m, r, p in STEP_LINE.findall(output)
    ]
    assert len(steps) == output.count("STEP "), f"unparsed STEP lines:\n{output}"
    return steps
