"""The live preview: `alaya-flash serve`, one page that shows and steers a stream as it renders.

protocol.py      what clients may send (validated, size- and rate-limited)
wire.py          the binary messages: G-buffer frames engines send, frame messages the server sends
transport.py     per-client latest-frame slots (slow viewers skip frames, the renderer never waits);
                 an engine's ordered outbox
ingest.py        an engine's session: its frames -> its own renderer on the shared weights -> frames back
sources.py       the playable physics world and a looped G-buffer file stream, one frame per call
page_session.py  the page's session: its render thread, source -> renderer -> JPEG frames, paced, with metrics
renderers.py     what a session renders with (LiveRenderer): the standard Flash pipeline or a saved workflow
recorder.py      recording through the project's sinks (RGB, G-buffers, controls as JSON lines)
server.py        aiohttp: the page, its static files, the page's WebSocket, engine sessions (/engine)
static/          the page (index.html, app.js, style.css)
docs/live.md describes usage, controls, protocols, sessions and limits; alaya_flash.client
(client.py at the root) is an engine's side.
"""
