"""A deploy agent cleaning up preview environments: every namespace deletion waits for on-call,
and each namespace is deleted at most once.

    python main.py

Runs unattended: on-call's answers come from a ScriptedApprovalProvider (grant, deny, grant),
the provider ctrlrun ships for tests and demos. With the default LocalApprovalProvider
the same code would wait for `ctrlrun approve <id>` at a terminal. Every run starts from a clean
store in .ctrlrun/.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import ctrlrun
from ctrlrun import (
    Control,
    JSONLEventSink,
    Policy,
    ScriptedApprovalProvider,
    SQLiteStateStore,
)

HERE = Path(__file__).resolve().parent
STATE = HERE / ".ctrlrun"


class FakeCluster:
    """Stands in for the Kubernetes API of several clusters."""

    def __init__(self) -> None:
        self.namespaces = {
            "staging-eu": {"preview-412", "preview-413", "default"},
            "staging-us": {"preview-412", "default"},
            "prod-eu": {"payments", "default"},
        }
        self.deleted: list[str] = []
        self.replicas: dict[str, int] = {}

    def delete_namespace(self, cluster: str, name: str) -> str:
        self.namespaces[cluster].remove(name)  # deleting twice would fail here (or worse)
        self.deleted.append(f"{cluster}/{name}")
        return f"namespace {name} deleted from {cluster}"

    def scale(self, deployment: str, replicas: int) -> str:
        self.replicas[deployment] = replicas
        return f"{deployment} scaled to {replicas}"


def main() -> None:
    shutil.rmtree(STATE, ignore_errors=True)  # a clean slate on every run
    store = SQLiteStateStore(STATE / "state.db")
    oncall = ScriptedApprovalProvider(store, ["grant", "deny", "grant"],
                                      approver="oncall@example.com")
    control = Control(Policy.from_file(HERE / "ctrlrun.yaml"), store, oncall,
                      sinks=[JSONLEventSink(STATE)])
    k8s = FakeCluster()

    @ctrlrun.protect("k8s.delete_namespace", wait=True, control=control)  # key and resource from the policy
    def delete_namespace(cluster: str, name: str) -> str:
        return k8s.delete_namespace(cluster, name)

    @ctrlrun.protect("k8s.scale_deployment", control=control)
    def scale_deployment(deployment: str, replicas: int) -> str:
        return k8s.scale(deployment, replicas)

    def delete(cluster: str, name: str) -> None:
        label = f"delete {cluster}/{name}"
        try:
            print(f"{label}: {delete_namespace(cluster=cluster, name=name)}")
        except ctrlrun.DuplicateEffect as refused:
            print(f"{label}: refused, {refused.effect_key} already {refused.state}")
        except ctrlrun.ActionDenied as refused:
            print(f"{label}: refused ({refused.reason})")

    with ctrlrun.context(agent="deploy-agent"):
        delete("staging-eu", "preview-412")   # on-call grants: deleted
        delete("staging-eu", "preview-412")   # the agent's plan ran twice: refused before on-call is asked
        delete("prod-eu", "payments")         # on-call denies
        delete("staging-us", "preview-412")   # same name, other cluster: another effect, granted

        print(scale_deployment(deployment="web", replicas=4))  # allowed, no human
        try:
            scale_deployment(deployment="web", replicas=200)
        except ctrlrun.ApprovalRequired as asked:
            print(f"scale web to 200: waiting for on-call (`ctrlrun approve {asked.request_id}`)")

    print(f"deleted: {', '.join(k8s.deleted)}")
    print(f"prod-eu still has: {', '.join(sorted(k8s.namespaces['prod-eu']))}")
    print("receipts:")
    for receipt in store.receipts():
        print(f"  {receipt.action}  {receipt.effect_key or '-'}  {receipt.decision}/{receipt.result}"
              f"  approver={receipt.approver}")
    print(f"pending requests: {len(store.pending_approvals())}")
    store.close()


def parse_arguments() -> argparse.Namespace:
    """The command line, read before anything runs: ``--help`` shows what this does, and an
    option it does not take is refused (exit 2) instead of being ignored."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    return parser.parse_args()


if __name__ == "__main__":
    parse_arguments()  # it takes no options
    main()
