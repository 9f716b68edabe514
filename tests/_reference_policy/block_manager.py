"""FROZEN ORACLE COPY (see __init__.py); do not edit.

Fixed-size KV blocks: free list, per-request block tables, reference counts and prefix caching."""

from __future__ import annotations

from collections import OrderedDict

from .request import Request


class BlockManager:
    """Owns ``num_blocks`` KV blocks of ``block_size`` tokens.

    A full prompt block is identified by the hash chain of its tokens; once computed it is registered and can
    be shared (reference counted) by later requests with the same prefix. A block whose count drops to zero
    returns to the free list but keeps its contents and hash until it is handed out again (LRU eviction).
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hashes: list = [None] * num_blocks
        self.cached: dict = {}  # block hash -> block id
        # An ordered set; front = evict first. OrderedDict because a plain dict's next(iter()) scans past the
        # slots of keys deleted from its front, which made allocation quadratic in the number of blocks.
        self.free_blocks: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_blocks)

    @property
    def usage(self) -> float:
        return 1.0 - len(self.free_blocks) / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def match_prefix(self, request: Request) -> int:
        """Attach cached blocks of the request's prompt prefix; returns the number of tokens they hold.

        Only for a request that holds no blocks. At least one prompt token is always left to compute, so the
        pass that finishes the prompt still produces logits.
        """
        if not self.enable_prefix_caching or request.block_table:
            return 0
        bs = self.block_size
        table = request.block_table
        for i in range((request.num_prompt_tokens - 1) // bs):
            block = self.cached.get(request.block_hash(i, bs))
            if block is None:
                break
            if self.ref_counts[block] == 0:
                del self.free_blocks[block]
            self.ref_counts[block] += 1
            table.append(block)
        hit = len(table) * bs
        request.num_computed_tokens = hit
        request.num_cached_tokens = hit
        request.num_registered_blocks = len(table)
        return hit

    def allocate(self, request: Request, num_new_tokens: int) -> bool:
        """Make room for ``num_new_tokens`` more tokens of ``request``; all or nothing."""
        table = request.block_table
        needed = -(-(request.num_computed_tokens + num_new_tokens) // self.block_size) - len(table)
        if needed <= 0:
            return True
        free = self.free_blocks
        if needed > len(free):
            return False
        ref_counts, hashes = self.ref_counts, self.block_hashes
        popfront = free.popitem
        for _ in range(needed):
            block = popfront(last=False)[0]
            old = hashes[block]
            if old is not None:  # evict the stale cache entry of a reused block
                hashes[block] = None
                if self.cached.get(old) == block:
                    del self.cached[old]
            ref_counts[block] = 1
            table.append(block)
        return True

    def register_computed(self, request: Request) -> None:
        """Publish the request's prompt blocks that are now full and computed, for later prefix hits."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        full = min(request.num_computed_tokens, request.num_prompt_tokens) // bs
        table, hashes, cached = request.block_table, self.block_hashes, self.cached
        for i in range(request.num_registered_blocks, full):
            h = request.block_hash(i, bs)
            if h is None:
                full = i
                break
            block = table[i]
            if hashes[block] is None and h not in cached:
                cached[h] = block
                hashes[block] = h
        request.num_registered_blocks = max(request.num_registered_blocks, full)

    def free(self, request: Request) -> None:
        """Release the request's blocks (finish, abort or preemption); tail blocks are evicted first."""
        ref_counts, free = self.ref_counts, self.free_blocks
        for block in reversed(request.block_table):
            ref_counts[block] -= 1
            if ref_counts[block] == 0:
                free[block] = None
        request.block_table = []
        request.num_computed_tokens = 0
        request.num_registered_blocks = 0
