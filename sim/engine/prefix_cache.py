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
  queue, which evicts the deepest blocks of the least recently used chains first). A leaf
  piece is evicted from its tail, `granularity` tokens at a time (1: SGLang's pages; vLLM's
  block size), so a piece may stay partly cached.

Sizes: `size` is every cached token, `evictable` the unpinned ones. The engines count cached
tokens as KV in use and evictable ones as available to an allocation (sim/engine/schedulers/).
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
    def __init__(self, granularity: int = 1) -> None:
        self.root = Node(-1, 0, None, 0)
        self.granularity = granularity
        self.size = 0  # cached tokens
        self.pinned = 0  # cached tokens of pinned nodes
        self.clock = 0.0

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
            child.last_use = now
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
            done += child.cached
            if child.cached < length:
                break
            node = child
        return new, path

    # ---------------------------------------------------------------- eviction
    def evict(self, tokens: int) -> int:
        """Free at least `tokens` cached tokens from unpinned leaves, least recently used first
        (ties: the deepest first). Returns the tokens freed (less when not enough are evictable)."""
        if tokens <= 0:
            return 0
        heap: list[tuple[float, int, int, Node]] = []
        stack = [self.root]
        while stack:
            n = stack.pop()
            for c in n.children.values():
                if c.cached:
                    stack.append(c)
            if n is not self.root and n.refs == 0 and n.cached and not any(c.cached for c in n.children.values()):
                heapq.heappush(heap, (n.last_use, -n.depth, id(n), n))
        freed = 0
        g = self.granularity
        while heap and freed < tokens:
            _t, _d, _i, n = heapq.heappop(heap)
            need = tokens - freed
            cut = min(n.cached, -(-need // g) * g)
            n.cached -= cut
            self.size -= cut
            freed += cut
            if n.cached == 0:
                parent = n.parent
                assert parent is not None
                del parent.children[n.piece]
                if (parent is not self.root and parent.refs == 0 and parent.cached
                        and not any(c.cached for c in parent.children.values())):
                    heapq.heappush(heap, (parent.last_use, -parent.depth, id(parent), parent))
        return freed
