import ast


def deep_sum(x):
    if isinstance(x, list):
        return sum(deep_sum(y) for y in x)
    return x


print(deep_sum(ast.literal_eval(input())))
