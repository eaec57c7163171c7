"""The engine: a RenderRequest checked into a Clip, rendered by a Renderer that loads its networks once."""
