"""Fixed-size KV blocks: free list, per-request block tables, reference counts and prefix caching."""

from __future__ import annotations

from engine.policy.request import Request


class FreeBlockQueue:
    """The free blocks as an ordered set: ``take`` hands out from the front, ``give_back`` appends at the back,
    ``remove`` takes one out of the middle (a prefix-cache hit on a free block that still holds its contents).

    Runs of blocks move with one list slice or extend, not one operation per block (a prompt of 2,600 tokens takes
    163 blocks at once). ``remove`` cannot cut a list cheaply, so it leaves the block's entry in place and counts
    it as stale; ``take`` skips stale entries when it reaches them. A block's stale entries always come before
    its live one, since entries are only ever appended.
    """

    def __init__(self, blocks) -> None:
        self._entries: list[int] = list(blocks)
        self._head = 0  # entries before it are consumed
        self._stale: dict[int, int] = {}  # block -> entries of it to skip
        self.size = len(self._entries)  # free blocks

    def __iter__(self):
        """The free blocks, first to be handed out first (a walk over the queue, for inspection)."""
        stale = dict(self._stale)
        for block in self._entries[self._head:]:
            if stale.get(block):
                stale[block] -= 1
            else:
                yield block

    def take(self, n: int) -> list[int]:
        """The first ``n`` free blocks, removed (the caller checks that ``n <= size``)."""
        self.size -= n
        head = self._head
        if not self._stale:
            self._head = head + n
            return self._entries[head:head + n]
        blocks, entries, stale = [], self._entries, self._stale
        while len(blocks) < n:
            block = entries[head]
            head += 1
            count = stale.get(block)
            if not count:
                blocks.append(block)
            elif count == 1:
                del stale[block]
            else:
                stale[block] = count - 1
        self._head = head
        return blocks

    def give_back(self, blocks) -> None:
        """Append ``blocks`` at the back, in the order given."""
        before = len(self._entries)
        self._entries += blocks
        self.size += len(self._entries) - before
        if self._head > 4 * self.size + 1024:  # drop the consumed front now and then
            del self._entries[:self._head]
            self._head = 0

    def remove(self, block: int) -> None:
        """Take a free ``block`` out, wherever it is."""
        self._stale[block] = self._stale.get(block, 0) + 1
        self.size -= 1


class BlockManager:
    """Owns ``num_blocks`` KV blocks of ``block_size`` tokens.

    A full prompt block is identified by the hash chain of its tokens (``Request.block_hash``); once computed it
    is registered and can be shared (reference counted) by later requests with the same prefix. A block whose
    count drops to zero returns to the free queue but keeps its contents and hash until it is handed out again
    (LRU eviction). Only blocks with a hash can be shared, so only they keep a reference count; any other block
    is held by exactly one request, or free.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._free = FreeBlockQueue(range(num_blocks))
        self._hash_of: list = [None] * num_blocks  # the prompt-block hash a block holds, if published
        self._cached: dict = {}  # block hash -> block: exactly the blocks whose ``_hash_of`` is set
        self._refs: dict[int, int] = {}  # block with a hash -> requests holding it

    # -- inspection (snapshots, for tests and statistics) ---------------------------------------------------
    @property
    def free_blocks(self) -> list[int]:
        """The free blocks, first to be handed out first."""
        return list(self._free)

    @property
    def ref_counts(self) -> list[int]:
        """How many requests hold each block."""
        counts = [1] * self.num_blocks
        for block in self._free:
            counts[block] = 0
        for block, count in self._refs.items():
            counts[block] = count
        return counts

    @property
    def cached_blocks(self) -> list[int]:
        """The blocks holding a published prompt block, in block order."""
        return sorted(self._cached.values())

    @property
    def num_free_blocks(self) -> int:
        return self._free.size

    @property
    def usage(self) -> float:
        return 1.0 - self._free.size / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- requests' blocks -----------------------------------------------------------------------------------
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
            block = self._cached.get(request.block_hash(i, bs))
            if block is None:
                break
            count = self._refs[block]
            if count == 0:
                self._free.remove(block)
            self._refs[block] = count + 1
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
        if needed > self._free.size:
            return False
        blocks = self._free.take(needed)
        if self._refs:  # some blocks hold published prompt blocks: those handed out now lose them
            for block in blocks:
                old = self._hash_of[block]
                if old is not None:
                    self._hash_of[block] = None
                    del self._refs[block]
                    if self._cached.get(old) == block:
                        del self._cached[old]
        table += blocks
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
        table, hash_of, cached = request.block_table, self._hash_of, self._cached
        for i in range(request.num_registered_blocks, full):
            h = request.block_hash(i, bs)
            block = table[i]
            if hash_of[block] is None and h not in cached:
                cached[h] = block
                hash_of[block] = h
                self._refs[block] = 1  # it had no hash, so it was this request's alone
        request.num_registered_blocks = full

    def free(self, request: Request) -> None:
        """Release the request's blocks (finish, abort or preemption); tail blocks are evicted first."""
        table, refs = request.block_table, self._refs
        if not refs:  # no block has a hash, so none is shared: all go back
            self._free.give_back(table[::-1])
        else:
            released = []
            for block in reversed(table):
                count = refs.get(block)
                if count is not None:
                    refs[block] = count = count - 1
                    if count:
                        continue
                released.append(block)
            self._free.give_back(released)
        request.block_table = []
        request.num_computed_tokens = 0
        request.num_registered_blocks = 0
