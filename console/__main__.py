from console.cli import app

__all__: list[str] = []

app(prog_name="onward")
