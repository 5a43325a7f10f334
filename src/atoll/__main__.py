from atoll.cli.entry import main

main()
