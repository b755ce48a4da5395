"""Everything that talks to the page cache and holds descriptors: shared shard handles (a
bounded LRU per process), read-ahead for nearly sequential reads, and the samplers' chunk
hints. No paddle import, no format knowledge.
"""
