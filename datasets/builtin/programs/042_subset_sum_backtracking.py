def find_subsets(nums, target):
    nums = sorted(nums)
    found = []
    visited_nodes = 0

    def backtrack(start, remaining, chosen):
        nonlocal visited_nodes
        visited_nodes += 1
        if remaining == 0:
            found.append(list(chosen))
            return
        for i in range(start, len(nums)):
            if i > start and nums[i] == nums[i - 1]:
                continue
            if nums[i] > remaining:
                break
            chosen.append(nums[i])
            backtrack(i + 1, remaining - nums[i], chosen)
            chosen.pop()

    backtrack(0, target, [])
    return found, visited_nodes


nums = [int(x) for x in input().split()]
targets = [int(x) for x in input().split()]
for target in targets:
    subsets, nodes = find_subsets(nums, target)
    print(f"target {target}: {len(subsets)} subsets, {nodes} nodes explored")
    for s in subsets[:4]:
        print("   " + " + ".join(map(str, s)))
    if len(subsets) > 4:
        print(f"   ... and {len(subsets) - 4} more")
