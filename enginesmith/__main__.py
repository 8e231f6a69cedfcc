from enginesmith.cli import main

main()
