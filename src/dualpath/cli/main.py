def main() -> None:
    raise SystemExit("dualpath: not yet")
