STATUS_NAMES = {
    0: "OK",
    1: "INVALID_ARGUMENT",
    2: "IO",
    3: "FORMAT",
    4: "MISSING_TENSOR",
    5: "OUT_OF_MEMORY",
    6: "OUT_OF_PAGES",
    7: "CONTEXT_LENGTH",
    8: "UNSUPPORTED",
    9: "BACKEND",
    10: "INVARIANT",
}


class GlmrtError(Exception):
    def __init__(self, status, message):
        self.status = int(status)
        self.status_name = STATUS_NAMES.get(self.status, "UNKNOWN")
        self.message = message
        super().__init__(f"{self.status_name}: {message}")
