from console.cli import app

app(prog_name="onward")
