"""A job's workflow graph for the admin page: the jobs joined to it by edges, laid out by depth
(a job one row below its deepest parent), with the positions the page draws them at.

Bounded: at most MAX_NODES jobs (breadth first from the job asked for, so its neighbours come
first) and MAX_EDGES edges among them are drawn; the page says when a graph is larger. A layer
wider than COLUMNS jobs (a fan-out of 1,000) wraps onto further rows."""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass
from uuid import UUID

import asyncpg

from sidelinja_worker.admin import store

MAX_NODES = 300
MAX_EDGES = 1500
COLUMNS = 10
# A node is as wide as its longest line, "cancelled · " and a short id (store.short_id).
NODE_W, NODE_H, GAP_X, GAP_Y, MARGIN = 196, 44, 16, 36, 12


@dataclass(frozen=True, slots=True)
class Node:
    id: UUID
    job_type: str
    status: str
    attempts: int
    max_attempts: int
    cancelled_by: UUID | None
    depth: int
    x: int
    y: int

    @property
    def short_id(self) -> str:
        return store.short_id(self.id)

    @property
    def retryable(self) -> bool:
        return self.status in ("error", "cancelled")


@dataclass(frozen=True, slots=True)
class Edge:
    parent: UUID
    child: UUID
    run_anyway: bool
    x1: int
    y1: int
    x2: int
    y2: int


@dataclass(frozen=True, slots=True)
class Graph:
    focus: UUID
    nodes: list[Node]
    edges: list[Edge]
    width: int
    height: int
    more_nodes: bool  # the graph has more jobs than were drawn
    more_edges: bool


def depths(ids: list[UUID], edges: list[tuple[UUID, UUID]]) -> dict[UUID, int]:
    """The longest path from a root to each job (Kahn's order; graphs have no cycles, and a
    job left over by a cut graph gets the depth it has reached)."""
    children: dict[UUID, list[UUID]] = defaultdict(list)
    indegree = dict.fromkeys(ids, 0)
    for parent, child in edges:
        children[parent].append(child)
        indegree[child] += 1
    depth = dict.fromkeys(ids, 0)
    ready = deque(i for i in ids if indegree[i] == 0)
    while ready:
        node = ready.popleft()
        for child in children[node]:
            depth[child] = max(depth[child], depth[node] + 1)
            indegree[child] -= 1
            if indegree[child] == 0:
                ready.append(child)
    return depth


def layout(
    focus: UUID,
    rows: list[asyncpg.Record],
    edge_rows: list[asyncpg.Record],
    more_nodes: bool = False,
    more_edges: bool = False,
) -> Graph:
    ids = [r["id"] for r in rows]
    known = set(ids)
    pairs = [
        (e["parent_id"], e["child_id"])
        for e in edge_rows
        if e["parent_id"] in known and e["child_id"] in known
    ]
    depth = depths(ids, pairs)
    layers: dict[int, list[asyncpg.Record]] = defaultdict(list)
    for r in sorted(rows, key=lambda r: (r["created_at"], str(r["id"]))):
        layers[depth[r["id"]]].append(r)
    nodes: dict[UUID, Node] = {}
    top = MARGIN
    for level in sorted(layers):
        for i, r in enumerate(layers[level]):
            row, col = divmod(i, COLUMNS)
            nodes[r["id"]] = Node(
                r["id"],
                r["job_type"],
                r["status"],
                r["attempts"],
                r["max_attempts"],
                r["cancelled_by"],
                level,
                MARGIN + col * (NODE_W + GAP_X),
                top + row * (NODE_H + GAP_Y),
            )
        top += -(-len(layers[level]) // COLUMNS) * (NODE_H + GAP_Y)
    edges = [
        Edge(
            e["parent_id"],
            e["child_id"],
            e["run_anyway"],
            nodes[e["parent_id"]].x + NODE_W // 2,
            nodes[e["parent_id"]].y + NODE_H,
            nodes[e["child_id"]].x + NODE_W // 2,
            nodes[e["child_id"]].y,
        )
        for e in edge_rows
        if e["parent_id"] in nodes and e["child_id"] in nodes
    ]
    widest = min(COLUMNS, max((len(v) for v in layers.values()), default=1))
    return Graph(
        focus,
        list(nodes.values()),
        edges,
        2 * MARGIN + widest * (NODE_W + GAP_X) - GAP_X,
        top - GAP_Y + MARGIN,
        more_nodes,
        more_edges,
    )


async def load(conn: asyncpg.Connection, job_id: UUID) -> Graph | None:
    """The graph of job_id as the connection's scope sees it; None if it cannot see the job."""
    rows = await store.graph_nodes(conn, job_id, MAX_NODES + 1)
    if not any(r["id"] == job_id for r in rows):
        return None
    # In the walk's order, breadth first from the job: a cut keeps the jobs nearest to it.
    kept = rows[:MAX_NODES]
    edge_rows = await store.graph_edges(conn, [r["id"] for r in kept], MAX_EDGES + 1)
    return layout(
        job_id, kept, edge_rows[:MAX_EDGES], len(rows) > MAX_NODES, len(edge_rows) > MAX_EDGES
    )
