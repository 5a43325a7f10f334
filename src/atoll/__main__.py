from atoll.cli.main import main

main()
