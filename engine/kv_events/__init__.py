"""vLLM's KV cache events: the wire format (``wire``), this engine's publisher (``publisher``,
an observer of the step loop), a subscriber (``subscriber``) and the cache the events describe
(``cache_view``). The package's public names are gathered here; the modules import each other
only downwards (wire <- subscriber <- cache_view; wire <- publisher), never through this file.
"""
from engine.kv_events.cache_view import CachedBlock, PrefixCacheView, split_tokens
from engine.kv_events.publisher import KVEventPublisher, KVEventRecorder, to_kv_events
from engine.kv_events.subscriber import Gap, KVEventSubscriber, ReceivedBatch
from engine.kv_events.wire import (MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored,
                                   EventBatch, ExternalBlockHash, KVCacheEvent, KVEventBatch,
                                   binds, check_endpoint, decode_batch, encode_batch, hash_hex,
                                   offset_endpoint_port)

__all__ = ["AllBlocksCleared", "BlockRemoved", "BlockStored", "CachedBlock", "EventBatch",
           "ExternalBlockHash", "Gap", "KVCacheEvent", "KVEventBatch", "KVEventPublisher", "KVEventRecorder",
           "KVEventSubscriber", "MEDIUM_GPU", "PrefixCacheView", "ReceivedBatch", "binds",
           "check_endpoint", "decode_batch", "encode_batch", "hash_hex", "offset_endpoint_port",
           "split_tokens", "to_kv_events"]
