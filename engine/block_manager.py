"""Fixed-size KV blocks: free list, per-request block tables, reference counts and prefix caching."""

from __future__ import annotations

from engine.request import Request


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
        self.block_hashes: list = [None] * num_blocks
        self.cached: dict = {}  # block hash -> block id (exactly the blocks whose block_hashes entry is set)
        # The free list is an ordered set (front = evict first) kept as a queue: live entries are
        # ``_queue[_head:]`` minus removed ones, so that whole runs of blocks are taken and given back with one
        # slice or extend, not per block. A free block taken out of the middle (a prefix-cache hit) leaves a
        # stale entry, counted in ``_stale`` and skipped when the front reaches it; a block's stale entries
        # always come before its live one, since blocks are only ever appended.
        self._queue: list[int] = list(range(num_blocks))
        self._head = 0
        self._stale: dict[int, int] = {}
        self._num_free = num_blocks
        # Reference counts are kept only for blocks with a hash: a block without one is never shared, so it has
        # count 1 when in a block table and 0 when free.
        self._refs: dict[int, int] = {}
        self._changes = 0  # counts calls that changed blocks, so that snapshots for inspection can be cached
        self._view = None

    @property
    def free_blocks(self) -> dict[int, None]:
        """The free blocks as an ordered set, first to be handed out first (a snapshot, for inspection)."""
        return self._snapshot()[0]

    @property
    def ref_counts(self) -> list[int]:
        """Reference count of every block (a snapshot, for inspection)."""
        return self._snapshot()[1]

    def _snapshot(self) -> tuple[dict[int, None], list[int]]:
        key = self._changes
        if self._view is None or self._view[0] != key:
            stale = dict(self._stale)
            free = {}
            for block in self._queue[self._head:]:
                if stale.get(block):
                    stale[block] -= 1
                else:
                    free[block] = None
            counts = [1] * self.num_blocks
            for block in free:
                counts[block] = 0
            for block, count in self._refs.items():
                counts[block] = count
            self._view = (key, (free, counts))
        return self._view[1]

    @property
    def num_free_blocks(self) -> int:
        return self._num_free

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self._num_free

    @property
    def usage(self) -> float:
        return 1.0 - self._num_free / self.num_blocks

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
        refs = self._refs
        for i in range((request.num_prompt_tokens - 1) // bs):
            block = self.cached.get(request.block_hash(i, bs))
            if block is None:
                break
            count = refs[block]
            if count == 0:  # take it out of the free list
                self._stale[block] = self._stale.get(block, 0) + 1
                self._num_free -= 1
            refs[block] = count + 1
            table.append(block)
        self._changes += 1
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
        if needed > self._num_free:
            return False
        self._num_free -= needed
        queue, head = self._queue, self._head
        if not self._stale:
            blocks = queue[head:head + needed]
            self._head = head + needed
        else:
            blocks = []
            stale = self._stale
            while len(blocks) < needed:
                block = queue[head]
                head += 1
                count = stale.get(block)
                if count:  # an entry left behind by a prefix-cache hit
                    if count == 1:
                        del stale[block]
                    else:
                        stale[block] = count - 1
                else:
                    blocks.append(block)
            self._head = head
        if self._refs:  # some blocks have hashes: evict the stale cache entries of those reused now
            hashes, cached, refs = self.block_hashes, self.cached, self._refs
            for block in blocks:
                old = hashes[block]
                if old is not None:
                    hashes[block] = None
                    del refs[block]
                    if cached.get(old) == block:
                        del cached[old]
        table += blocks
        self._changes += 1
        return True

    def register_computed(self, request: Request, preempting: bool = False) -> None:
        """Publish the request's prompt blocks that are now full and computed, for later prefix hits.

        A simulated request (no token ids) has blocks of its own past any shared prefix that only it can hit, and
        only when it is readmitted after a preemption: they are published then (``preempting``), not after every
        pass. The cache then answers every lookup as if they had been published at once, with less work.
        """
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        full = min(request.num_computed_tokens, request.num_prompt_tokens) // bs
        if request.prompt_token_ids is None and not preempting:
            full = min(full, request.prefix_len // bs) if request.prefix_id is not None else 0
            if full <= request.num_registered_blocks:
                return
        table, hashes, cached = request.block_table, self.block_hashes, self.cached
        for i in range(request.num_registered_blocks, full):
            h = request.block_hash(i, bs)
            block = table[i]
            if hashes[block] is None and h not in cached:
                cached[h] = block
                hashes[block] = h
                self._refs[block] = 1  # a block without a hash is never shared: this request's alone
                self._changes += 1
        request.num_registered_blocks = max(request.num_registered_blocks, full)

    def free(self, request: Request) -> None:
        """Release the request's blocks (finish, abort or preemption); tail blocks are evicted first."""
        table, refs, queue = request.block_table, self._refs, self._queue
        if not refs:  # no block has a hash, so none is shared: all go back
            queue += reversed(table)
            self._num_free += len(table)
        else:
            for block in reversed(table):
                count = refs.get(block)
                if count is not None:
                    count -= 1
                    refs[block] = count
                    if count:
                        continue
                queue.append(block)
                self._num_free += 1
        self._changes += 1
        if self._head > 4 * self.num_blocks:  # drop the consumed front now and then
            del queue[:self._head]
            self._head = 0
        request.block_table = []
        request.num_computed_tokens = 0
        request.num_registered_blocks = 0
