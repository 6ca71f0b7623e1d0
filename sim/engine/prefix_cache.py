"""A prefix cache over content pieces: SGLang's radix tree and vLLM's block hash chain, in one.

A request carries its prompt's identity as *pieces*: `(piece_id, num_tokens)` pairs in order,
e.g. a Mooncake trace's `hash_ids` (one id per 512-token block), or a conversation's earlier
turns and replies followed by the new message. Two prompts share a prefix exactly as far as
their pieces agree, so the cache is a trie of pieces (a radix tree whose edges are pieces).

- `match(pieces, limit)`: the tokens of the longest cached prefix, at most `limit` (the engines
  cap a hit: SGLang at input_len - 1, vLLM at whole blocks of input_len - 1), and the path.
- `lock(path)` / `unlock(path)`: a running request pins the nodes it uses (SGLang's lock_ref,
  vLLM's ref_cnt); pinned nodes are never evicted.
- `insert(pieces, tokens)`: the first `tokens` tokens of a prompt (plus its output, given as
  a piece of its own) enter the cache; returns how many tokens were new to it.
- `evict(tokens)`: frees at least `tokens` tokens from unpinned leaves, least recently used
  first (SGLang's LRU over evictable leaves; vLLM frees a request's blocks tail first into an LRU
  queue, which evicts the deepest blocks of the least recently used chains first). vLLM's leaf
  piece is evicted from its tail, `granularity` tokens at a time (its block size), so a piece
  may stay partly cached; SGLang's radix tree frees whole leaves (`whole_leaves`:
  radix_cache.py `RadixCache.evict` frees a leaf's whole value and deletes it), so an eviction
  may free more than it asked for.

Sizes: `size` is every cached token, `evictable` the unpinned ones. The engines count cached
tokens as KV in use and evictable ones as available to an allocation (sim/engine/schedulers/).

The eviction order is kept in a heap of candidate leaves updated as nodes are used, locked and
unlocked (lazy deletion: an entry whose node has changed since it was pushed is skipped), so an
eviction under pressure costs the leaves it frees, not a walk of the whole tree. Ties of last
use and depth go to the node pushed first, so runs are deterministic.
"""

from __future__ import annotations

import heapq
from typing import Sequence

Pieces = Sequence[tuple[int, int]]


class Node:
    __slots__ = ("piece", "length", "cached", "children", "parent", "refs", "last_use", "depth")

    def __init__(self, piece: int, length: int, parent: "Node | None", depth: int) -> None:
        self.piece = piece
        self.length = length  # the piece's full length (tokens)
        self.cached = 0  # how many of its first tokens are cached (0 < cached <= length once inserted)
        self.children: dict[int, Node] = {}
        self.parent = parent
        self.refs = 0  # running requests pinning it
        self.last_use = 0.0
        self.depth = depth  # tokens before this piece


class PrefixCache:
    def __init__(self, granularity: int = 1, whole_leaves: bool = False) -> None:
        self.root = Node(-1, 0, None, 0)
        self.granularity = granularity
        self.whole_leaves = whole_leaves
        self.size = 0  # cached tokens
        self.pinned = 0  # cached tokens of pinned nodes
        self.clock = 0.0
        self.num_nodes = 0
        # eviction candidates: (last use, -depth, push order, node); stale entries are skipped
        self._heap: list[tuple[float, int, int, Node]] = []
        self._seq = 0

    def _push(self, n: Node) -> None:
        """`n` may now be evicted (an unpinned cached leaf): a heap entry at its current use."""
        if n.refs == 0 and n.cached and not n.children and n is not self.root:
            self._seq += 1
            heapq.heappush(self._heap, (n.last_use, -n.depth, self._seq, n))
            if len(self._heap) > 4 * self.num_nodes + 1024:
                self._rebuild()

    def _rebuild(self) -> None:
        """A fresh heap of the current candidates (the stale entries dropped)."""
        self._heap = []
        stack = [self.root]
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            if n is not self.root and n.refs == 0 and n.cached and not n.children:
                self._seq += 1
                self._heap.append((n.last_use, -n.depth, self._seq, n))
        heapq.heapify(self._heap)

    def _valid(self, entry: tuple[float, int, int, Node]) -> bool:
        n = entry[3]
        return (n.refs == 0 and n.cached > 0 and not n.children and n.last_use == entry[0]
                and n.parent is not None and n.parent.children.get(n.piece) is n)

    @property
    def evictable(self) -> int:
        return self.size - self.pinned

    # ---------------------------------------------------------------- lookup
    def match(self, pieces: Pieces, limit: int, now: float) -> tuple[int, list[Node]]:
        """(tokens hit, nodes used) for the longest cached prefix of `pieces`, at most `limit`
        tokens; the nodes' last use is set to `now` (a hit refreshes the LRU order)."""
        node, hit, path = self.root, 0, []
        for piece, length in pieces:
            child = node.children.get(piece)
            if child is None or child.cached == 0 or hit >= limit:
                break
            path.append(child)
            if child.last_use != now:
                child.last_use = now
                self._push(child)
            take = min(child.cached, limit - hit)
            hit += take
            if child.cached < length or take < child.cached:
                break
            node = child
        return hit, path

    def lock(self, path: list[Node]) -> None:
        for n in path:
            if n.refs == 0:
                self.pinned += n.cached
            n.refs += 1

    def unlock(self, path: list[Node]) -> None:
        for n in path:
            n.refs -= 1
            if n.refs == 0:
                self.pinned -= n.cached
                self._push(n)

    # ---------------------------------------------------------------- insertion
    def insert(self, pieces: Pieces, tokens: int, now: float) -> tuple[int, list[Node]]:
        """Cache the first `tokens` tokens of `pieces` (whole granules only: a partial last
        granule stays the request's own). Returns (tokens new to the cache, the path's nodes)."""
        g = self.granularity
        tokens -= tokens % g
        node, done, new, path = self.root, 0, 0, []
        for piece, length in pieces:
            if done >= tokens:
                break
            child = node.children.get(piece)
            if child is None:
                child = Node(piece, length, node, done)
                node.children[piece] = child
                self.num_nodes += 1
            want = min(length, tokens - done)
            if want > child.cached:
                grow = want - child.cached
                child.cached = want
                self.size += grow
                new += grow
                if child.refs:
                    self.pinned += grow
            child.last_use = now
            path.append(child)
            self._push(child)
            done += child.cached
            if child.cached < length:
                break
            node = child
        return new, path

    # ---------------------------------------------------------------- eviction
    def evict(self, tokens: int) -> int:
        """Free at least `tokens` cached tokens from unpinned leaves, least recently used first
        (ties: the deepest, then the one that became a candidate first). Returns the tokens
        freed (less when not enough are evictable)."""
        if tokens <= 0:
            return 0
        freed = 0
        g = self.granularity
        heap = self._heap
        while heap and freed < tokens:
            entry = heapq.heappop(heap)
            if not self._valid(entry):
                continue
            n = entry[3]
            need = tokens - freed
            cut = n.cached if self.whole_leaves else min(n.cached, -(-need // g) * g)
            n.cached -= cut
            self.size -= cut
            freed += cut
            if n.cached == 0:
                parent = n.parent
                assert parent is not None
                del parent.children[n.piece]
                self.num_nodes -= 1
                self._push(parent)
            else:
                heapq.heappush(heap, entry)  # (still the least recently used: its entry stays valid)
        return freed
