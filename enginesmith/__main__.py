import enginesmith.entry  # noqa: F401  (first: our components, never a same-named folder in the working directory)
from enginesmith.cli import main

main()
