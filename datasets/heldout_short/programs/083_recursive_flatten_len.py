import ast


def flatten(x):
    out = []
    for y in x:
        if isinstance(y, list):
            out.extend(flatten(y))
        else:
            out.append(y)
    return out


flat = flatten(ast.literal_eval(input()))
print(flat)
print(len(flat))
