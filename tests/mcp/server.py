"""An MCP server for kart's tests: the Python SDK's MCPServer (`pip install mcp`) on the
streamable HTTP transport, with tools a tool-calling agent might use.

    python tests/mcp/server.py PORT
"""

import asyncio
import sys

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("kart-test-tools")

CAPITALS = {"france": "Paris", "japan": "Tokyo", "kenya": "Nairobi"}


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def capital(country: str) -> str:
    """The capital city of a country."""
    try:
        return CAPITALS[country.lower()]
    except KeyError:
        # A ToolError's message reaches the client (other exceptions are masked).
        raise ToolError(f"no capital known for {country}") from None


in_flight = 0
most_in_flight = 0
arrivals = asyncio.Condition()


@server.tool()
async def wait(seconds: float, until_in_flight: int = 0) -> str:
    """Sleep, then say so (counts the calls in flight at once); with `until_in_flight`, only until
    that many calls have been in flight together."""
    global in_flight, most_in_flight
    in_flight += 1
    most_in_flight = max(most_in_flight, in_flight)
    try:
        async with arrivals:
            arrivals.notify_all()
        if until_in_flight:
            reached = lambda: most_in_flight >= until_in_flight  # noqa: E731

            async def arrived():
                async with arrivals:  # released while waiting
                    await arrivals.wait_for(reached)

            try:
                await asyncio.wait_for(arrived(), seconds)
            except TimeoutError:
                pass
        else:
            await asyncio.sleep(seconds)
    finally:
        in_flight -= 1
    return f"waited {seconds}"


@server.tool()
def peak() -> int:
    """The most `wait` calls in flight at once so far, then reset."""
    global most_in_flight
    most, most_in_flight = most_in_flight, 0
    return most


if __name__ == "__main__":
    server.run(transport="streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
