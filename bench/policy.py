"""Policy evaluation alone and the action hash alone, per call, on a generated policy.

The policy has 200 actions, each with an effect key and four rules (three with two or three
conditions using ``in``, ``eq``, ``neq``, ``lt``, ``gte``, ``lte``; a final deny). The calls cycle
through all 200 actions with argument sets that land on every rule (allow, approve twice, deny),
so evaluation walks one to four rules.

- ``evaluate``: ``policy.evaluate(action)`` on prebuilt actions;
- ``action hash``: building the ``Action`` (check, freeze, canonical JSON, SHA-256) — what the
  normalize step does for every call;
- ``SHA-256 only``: ``hashlib.sha256`` over the canonical bytes, for scale;
- ``receipt hash``: ``Receipt.chained(seq, prev_hash)`` on the receipt of an allowed refund (the
  hash every call adds to the chain: the 34-key document, canonical JSON, SHA-256).

These calls take microseconds, so each sample times a batch of 20 calls.
"""

from __future__ import annotations

import hashlib

from .common import Results, Row, Series, Settings, perf_ns, time_batches

ACTIONS = 200
BATCH = 20
POLICY_LABEL = f"{ACTIONS}-action policy"

ARGUMENT_SETS = (
    # allow (rule 0)
    {"ref": "r-1", "amount": 12_000, "currency": "EUR", "region": "eu-west-1", "tier": "pro"},
    # approve (rule 1)
    {"ref": "r-2", "amount": 250_000, "currency": "EUR", "region": "us-east-1", "tier": "pro"},
    # approve (rule 2)
    {"ref": "r-3", "amount": 900_000, "currency": "USD", "region": "us-east-1", "tier": "pro"},
    # deny (no rule but the last)
    {"ref": "r-4", "amount": 9_000_000, "currency": "USD", "region": "ap-south-1", "tier": "free"},
)


def generated_policy(actions: int = ACTIONS) -> str:
    lines = ["schema: ctrlrun.policy/v2", "actions:"]
    for i in range(actions):
        lines += [
            f"  svc{i:03d}.operate:",
            f'    effect: "svc{i:03d}:{{ref}}"',
            "    rules:",
            "      - when: { region_in: [eu-west-1, eu-central-1], amount_gte: 0, amount_lte: 50000 }",
            "        decision: allow",
            "      - when: { currency_eq: EUR, amount_gte: 0, amount_lte: 500000 }",
            "        decision: approve",
            "      - when: { tier_neq: free, amount_lt: 5000000 }",
            "        decision: approve",
            "      - decision: deny",
        ]
    return "\n".join(lines) + "\n"


def run(settings: Settings, pg: object, results: Results) -> None:
    from ctrlrun import Action, Decision, Policy, Principal, canonicalize

    n = settings.micro_calls - settings.micro_calls % BATCH
    print(f"- policy evaluation and action hash: {ACTIONS} actions, {n} calls each", flush=True)
    text = generated_policy()
    t0 = perf_ns()
    policy = Policy.from_yaml(text, source="bench-generated")
    load_ms = (perf_ns() - t0) / 1e6
    principal = Principal("bench-agent")
    names = [f"svc{i:03d}.operate" for i in range(ACTIONS)]
    # 200 x 4 = 800 distinct (name, arguments) pairs, visited round-robin
    cases = [(name, ARGUMENT_SETS[(i + j) % 4]) for j in range(4) for i, name in enumerate(names)]
    actions = [Action(name, args, principal) for name, args in cases]
    decisions = {str(policy.evaluate(a).decision) for a in actions}
    if decisions != {str(Decision.ALLOW), str(Decision.APPROVE), str(Decision.DENY)}:
        results.violation(f"the generated policy decided only {sorted(decisions)}")
    count = len(cases)

    def evaluate(i: int) -> None:
        policy.evaluate(actions[i % count])

    def build(i: int) -> None:
        name, args = cases[i % count]
        Action(name, args, principal)

    canon = [canonicalize(a) for a in actions]

    def sha(i: int) -> None:
        hashlib.sha256(canon[i % count]).hexdigest()

    receipt = _allow_receipt()
    prev = receipt.prev_hash or "sha256:" + "0" * 64

    def chain(i: int) -> None:
        receipt.chained(i + 1, prev)

    variants = (("evaluate", evaluate), ("action hash", build), ("SHA-256 only", sha),
                ("receipt hash", chain))  # fmt: skip
    for variant, fn in variants:
        series = Series(per_sample=BATCH)
        time_batches(series, fn, range(count))  # warm-up
        series = Series(per_sample=BATCH)
        time_batches(series, fn, range(n))
        note = ""
        if variant == "evaluate":
            note = f"{ACTIONS} actions × 4 rules; loading it took {load_ms:.0f} ms"
        elif variant == "action hash":
            note = "Action(): check, freeze, canonical JSON, SHA-256"
        elif variant == "receipt hash":
            note = "Receipt.chained() on an allowed refund's receipt"
        where = "allow receipt" if variant == "receipt hash" else POLICY_LABEL
        results.rows.append(Row("policy", where, variant, series, None, note))


def _allow_receipt() -> object:
    """The receipt of one allowed refund (in-memory store)."""
    import ctrlrun
    from ctrlrun import InMemoryStateStore

    from .common import AGENT, ALLOWED_AMOUNT
    from .stores import protected_refund

    store = InMemoryStateStore()
    _, protected = protected_refund(store)
    with ctrlrun.context(agent=AGENT):
        protected(payment_id="p0", amount=ALLOWED_AMOUNT)
    return store.receipts()[-1]
