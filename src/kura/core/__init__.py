"""Pure rules and values: no IO, no asyncio, no third-party clients."""
