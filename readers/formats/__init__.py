"""Byte layouts of packed datasets, defined once and shared by the writer and the readers.

Nothing in this package imports paddle, so `packer` can use it without pulling in the
training stack.
"""
