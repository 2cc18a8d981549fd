"""Communication profiles (``run.sh --comm-profile default|ethernet|infiniband|debug``): the NCCL and
torch.distributed variables the cluster guides and WeNet's multi-node notes set, each for a failure it
prevents. A variable already in the environment is never overwritten: the user's value wins.

Reads the environment; writes nothing (run.sh evaluates the ``export`` lines ``exports()`` returns).

  for var in profile("ethernet", socket_ifname="eth0"): print(var.name, var.value, var.why)
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from funasr_recipe.core.rejections import BadInputError

# default: one node or an unknown fabric, only what every run needs.
PROFILES = ("default", "ethernet", "infiniband", "debug")


@dataclass(frozen=True)
class CommVar:
    name: str
    value: str
    why: str


def _common(timeout_min: int) -> list[CommVar]:
    return [
        CommVar("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1", "a rank that dies or a collective that times out "
                "aborts the job with an error instead of leaving the other ranks hung"),
        CommVar("DEEPSPEED_TIMEOUT", str(timeout_min), "minutes a collective may wait: DeepSpeed's 10 kill "
                "a job whose ranks wait at a barrier while node 0 writes a large checkpoint to NFS"),
        CommVar("NCCL_DEBUG", "WARN", "NCCL's own warnings (a fallback to sockets, a bad NIC) reach the log"),
    ]


def profile(name: str, socket_ifname: str = "", ib_hca: str = "") -> list[CommVar]:
    """The variables of one profile, in the order they are exported."""
    if name not in PROFILES:
        raise BadInputError(f"--comm-profile {name}: expected one of {', '.join(PROFILES)}")
    out: list[CommVar] = []
    if socket_ifname:
        out.append(CommVar("NCCL_SOCKET_IFNAME", socket_ifname, "NCCL and the bootstrap use this interface; "
                           "left alone NCCL may pick docker0 or a management NIC the other nodes cannot "
                           "reach (connection refused, or a hang at the first all-reduce)"))
        out.append(CommVar("GLOO_SOCKET_IFNAME", socket_ifname, "the same for gloo (CPU training and the "
                           "preflight's CPU collectives)"))
    if name == "default":
        out += _common(30)
    elif name == "ethernet":
        out += _common(30)
        out += [
            CommVar("NCCL_IB_DISABLE", "1", "no InfiniBand/RoCE here: NCCL must not try RDMA devices it "
                    "finds (init errors, or a silent fallback after long timeouts)"),
            CommVar("NCCL_SOCKET_NTHREADS", "4", "one socket thread cannot fill a 25-100 GbE link (bus "
                    "bandwidth far below the link's); 4 threads x 4 sockets can"),
            CommVar("NCCL_NSOCKS_PERTHREAD", "4", "see NCCL_SOCKET_NTHREADS (their product is at most 64)"),
        ]
    elif name == "infiniband":
        out += _common(30)
        out += [
            CommVar("NCCL_IB_DISABLE", "0", "use the InfiniBand verbs transport (an inherited 1 would send "
                    "all traffic over TCP at a fraction of the bandwidth)"),
            CommVar("NCCL_IB_TIMEOUT", "22", "IB retransmission timeout exponent: the default gives up on a "
                    "congested fabric with 'NET/IB: Got completion with error 12'"),
            CommVar("NCCL_IB_RETRY_CNT", "7", "retries before that error (the maximum)"),
            CommVar("NCCL_NET_GDR_LEVEL", "PHB", "GPUDirect RDMA when NIC and GPU share a PCIe host bridge: "
                    "without it every message is staged through host memory"),
        ]
        if ib_hca:
            out.append(CommVar("NCCL_IB_HCA", ib_hca, "only these HCAs: a storage or management HCA in the "
                               "list makes NCCL stripe traffic over a slow port"))
    else:  # debug
        out += _common(5)
        out += [
            CommVar("NCCL_DEBUG", "INFO", "NCCL logs its topology, transports and rings: which NIC, IB or "
                    "sockets, P2P or SHM"),
            CommVar("NCCL_DEBUG_SUBSYS", "INIT,NET,ENV", "the subsystems that explain a hang at start-up"),
            CommVar("TORCH_DISTRIBUTED_DEBUG", "DETAIL", "torch checks that every rank calls the same "
                    "collective with the same shapes (a mismatch otherwise hangs)"),
            CommVar("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000", "the flight recorder: the last collectives of "
                    "each rank, dumped on a timeout, show which rank is behind"),
            CommVar("TORCH_NCCL_DUMP_ON_TIMEOUT", "1", "write that dump when the watchdog fires"),
            CommVar("NCCL_PROTO", "Simple", "rule out the LL/LL128 protocols (LL128 hangs or corrupts on "
                    "some PCIe/NVLink topologies)"),
            CommVar("NCCL_ALGO", "Ring", "rule out the tree and CollNet algorithms: the plainest path"),
        ]
    # A later entry of the same name (debug's NCCL_DEBUG) replaces the common one.
    return list({v.name: v for v in out}.values())


def resolve(variables: list[CommVar], environ: Mapping[str, str]) -> list[tuple[CommVar, bool]]:
    """Each variable with whether the profile sets it (False: the environment already has a value)."""
    return [(v, v.name not in environ) for v in variables]


def exports(variables: list[CommVar], environ: Mapping[str, str]) -> list[str]:
    """``export NAME=value`` lines for the variables the environment does not set yet."""
    return [f"export {v.name}={shlex.quote(v.value)}"
            for v, applies in resolve(variables, environ) if applies]
