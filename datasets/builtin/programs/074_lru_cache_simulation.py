from collections import OrderedDict


class LRUCache:
    def __init__(self, capacity):
        self.capacity = capacity
        self.data = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.evicted = []

    def access(self, key):
        if key in self.data:
            self.data.move_to_end(key)
            self.hits += 1
            return "hit"
        self.misses += 1
        if len(self.data) >= self.capacity:
            old, _ = self.data.popitem(last=False)
            self.evicted.append(old)
        self.data[key] = True
        return "miss"


capacity = int(input())
pages = [int(x) for x in input().split()]
cache = LRUCache(capacity)
for page in pages:
    outcome = cache.access(page)
    contents = list(cache.data.keys())
    print(f"page {page:2d}: {outcome:<4}  cache {contents}")
total = cache.hits + cache.misses
ratio = cache.hits / total
print(f"hits {cache.hits}, misses {cache.misses}, hit ratio {ratio:.3f}")
print("evicted in order:", cache.evicted)
