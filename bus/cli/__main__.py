from bus.cli.entry import main

main()
