from bus.cli import main

main()
