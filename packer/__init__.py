"""packer: turn a directory tree of images and labels into LMDB or RecordIO shards."""

__version__ = "0.1.0"
