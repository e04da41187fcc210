from collections import OrderedDict


class LRUCache:
    def __init__(self, capacity):
        self.capacity = capacity
        self.data = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.evicted = []

    def get(self, key):
        if key in self.data:
            self.data.move_to_end(key)
            self.hits += 1
            return self.data[key]
        self.misses += 1
        return None

    def put(self, key, value):
        if key in self.data:
            self.data.move_to_end(key)
        self.data[key] = value
        if len(self.data) > self.capacity:
            old_key, _ = self.data.popitem(last=False)
            self.evicted.append(old_key)

    def __repr__(self):
        items = ", ".join(f"{k}={v}" for k, v in self.data.items())
        return f"LRU[{items}]"


capacity = int(input())
cache = LRUCache(capacity)
for line in iter(input, "end"):
    parts = line.split()
    if parts[0] == "put":
        cache.put(parts[1], int(parts[2]))
        print(f"put {parts[1]:<3} -> {cache}")
    else:
        value = cache.get(parts[1])
        status = "hit " if value is not None else "miss"
        print(f"get {parts[1]:<3} {status} {value}")
print("hits:", cache.hits, "misses:", cache.misses)
print("evicted order:", cache.evicted)
ratio = cache.hits / (cache.hits + cache.misses)
print(f"hit ratio: {ratio:.0%}")
