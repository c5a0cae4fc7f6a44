"""Policies several test modules share."""

REFUND_POLICY = """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    rules:
      - when: { amount_gte: 0, amount_lte: 50000 }
        decision: allow
      - when: { amount_gte: 0, amount_lte: 500000 }
        decision: approve
      - decision: deny
"""

#: the authority spec's worked-example document, verbatim (its policy hash is pinned)
WORKED = """\
schema: ctrlrun.policy/v7
authority:
  max_delegation_depth: 2          # optional; int >= 0, bool refused; default 3; 0 = no delegation
  grants:
    - id: head-of-support                                         # required
      subject: { agent: "head-of-support", user: "dana@example.com" }  # required
      actions: ["stripe.refund"]                                  # required, non-empty
      resources: ["payment:*"]                                    # optional: absent = any
      constraints: { amount_gte: 0, amount_lte: 10000000 }        # optional, `when:` syntax
      environments: ["production"]                                # optional, exact names
      delegable: true                                             # optional, default false
      expires_at: "2027-01-01T00:00:00Z"                          # optional, offset required
      # tasks: ["refund-run:*"]                                   # optional (v7), §7
      budgets:                                                    # optional (v7), §6
        - { metric: amount, limit: 50000000, window: P1D }
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    resource: "payment:{payment_id}"
    rules:
      - { when: { amount_gte: 0, amount_lte: 100000 }, decision: allow }
      - { when: { amount_gte: 0, amount_lte: 1000000 }, decision: approve }
      - { decision: deny }
"""
