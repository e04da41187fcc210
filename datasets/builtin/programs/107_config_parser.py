import sys


class ConfigError(Exception):
    pass


def parse_value(raw):
    raw = raw.strip()
    if raw.lower() in ("true", "yes", "on"):
        return True
    if raw.lower() in ("false", "no", "off"):
        return False
    try:
        return int(raw)
    except ValueError:
        pass
    try:
        return float(raw)
    except ValueError:
        return raw.strip('"')


config = {}
section = "global"
errors = []
for lineno, line in enumerate(sys.stdin, 1):
    line = line.split("#", 1)[0].strip()
    if not line:
        continue
    try:
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
            config.setdefault(section, {})
            continue
        if "=" not in line:
            raise ConfigError(f"line {lineno}: missing '='")
        key, value = line.split("=", 1)
        key = key.strip()
        if not key:
            raise ConfigError(f"line {lineno}: empty key")
        config.setdefault(section, {})[key] = parse_value(value)
    except ConfigError as exc:
        errors.append(str(exc))

for name in sorted(config):
    print(f"[{name}]")
    for key in sorted(config[name]):
        value = config[name][key]
        print(f"  {key:<10} = {value!r:<12} ({type(value).__name__})")
print("errors:")
for err in errors:
    print("  " + err)
port = config.get("server", {}).get("port", 80)
print("effective port:", port + 1 if config["server"].get("debug") else port)
