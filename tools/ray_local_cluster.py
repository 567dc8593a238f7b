"""A Ray cluster of several nodes on this machine, to try what a cluster does (runs spread
over nodes, a node lost mid-sweep) without a second machine; a development harness, not
part of the package (it needs the clone and the extra ``attnscale[ray]``):

    python tools/ray_local_cluster.py --nodes 2 --cpus 1

Ray's own CLI cannot do it safely: ``ray start --address`` refuses a second node in
single-host mode, and outside that mode it rewrites 127.0.0.1 into the host's outward
address and listens on every interface. This starts the nodes as Ray's own tests do
(``ray.cluster_utils.Cluster``): every process bound to 127.0.0.1, no dashboard, no usage
statistics. It prints the address for ``--ray-address`` (and makes it the one
``--ray-address auto`` finds), writes each node's process ids to ``PIDS/node-<i>.pids``
(the raylet first: ``pgrep -P`` of it gives the node's task workers), and runs until
interrupted (Ctrl-C or SIGTERM), then stops every node.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

__all__ = ["main"]


def _pids(node) -> list[int]:
    raylet = [p.process.pid for p in node.all_processes.get("raylet", ())]
    rest = [p.process.pid for kind, ps in node.all_processes.items() if kind != "raylet" for p in ps]
    return raylet + rest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/ray_local_cluster.py",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2, help="nodes, the head included (default: %(default)s)")
    parser.add_argument("--cpus", type=int, default=1, help="CPUs each node lends to runs (default: %(default)s)")
    parser.add_argument("--port", type=int, help="the head's port (default: a free one)")
    parser.add_argument("--client-port", type=int, default=10001,
                        help="the head's Ray Client port, for ray://127.0.0.1:PORT; 0: none (default: %(default)s)")
    parser.add_argument("--pids", type=Path, default=Path("/tmp/attnscale-ray"),
                        help="folder for node-<i>.pids (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.cpus < 1:
        parser.error("--nodes and --cpus take positive integers")
    from attnscale.runs.ray_connect import import_ray, this_host_only

    import_ray()
    from ray.cluster_utils import Cluster

    head = dict(node_ip_address="127.0.0.1", num_cpus=args.cpus, include_dashboard=False)
    if args.port:
        head["port"] = args.port
    if args.client_port:
        head["ray_client_server_port"] = args.client_port
    stop = threading.Event()
    with this_host_only():
        cluster = Cluster(initialize_head=True, head_node_args=head)
    try:
        with this_host_only():
            nodes = [cluster.head_node] + [cluster.add_node(node_ip_address="127.0.0.1", num_cpus=args.cpus)
                                           for _ in range(args.nodes - 1)]
        # after the nodes: each one installs Ray's own SIGTERM handler, which drains and exits with 1
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        args.pids.mkdir(parents=True, exist_ok=True)
        print(f"Ray cluster of {len(nodes)} nodes on 127.0.0.1: --ray-address {cluster.address} (or auto)"
              + (f", Ray Client ray://127.0.0.1:{args.client_port}" if args.client_port else ""), flush=True)
        for i, node in enumerate(nodes):
            path = args.pids / f"node-{i}.pids"
            path.write_text("".join(f"{pid}\n" for pid in _pids(node)))
            print(f"  node {i}{' (head)' if i == 0 else ''}: {args.cpus} CPUs, id {node.node_id[:12]}, "
                  f"process ids in {path}", flush=True)
        print("Ctrl-C or kill stops it", flush=True)
        try:
            while not stop.wait(1.0):
                pass
        except KeyboardInterrupt:
            pass
    finally:
        cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
