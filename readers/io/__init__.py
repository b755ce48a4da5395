"""Everything that talks to the page cache and holds descriptors; no paddle, no format knowledge.

Shared shard handles (a bounded LRU per process), read-ahead for nearly sequential reads, and
the samplers' chunk hints.
"""
