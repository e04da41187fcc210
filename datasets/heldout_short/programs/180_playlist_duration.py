class Playlist:
    def __init__(self):
        self.songs = []

    def add(self, seconds):
        self.songs.append(seconds)

    def total(self):
        return sum(self.songs)


p = Playlist()
for t in input().split():
    m, s = t.split(":")
    p.add(int(m) * 60 + int(s))
mins, secs = divmod(p.total(), 60)
print(len(p.songs), "songs")
print(f"{mins}:{secs:02d}")
