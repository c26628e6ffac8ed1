"""app/plots.py memoizes Plotly's property-path parser: the same paths, the same figures, parsed once."""
import plotly.basedatatypes as B
import plotly.graph_objects as go

from app import plots

PATHS = ["xaxis_title_text", "xaxis.title.text", "error_x_thickness", "marker.colorbar.title.side",
         "annotations[0].text", "yaxis2_range", "_private", "a__b_", "", "layout.shapes[12].line.dash"]


def test_the_parser_is_memoized_once_and_parses_as_plotly_does():
    parse = B._str_to_dict_path_full
    assert hasattr(parse, "cache_info")
    plots.memoize_plotly_paths()  # a second call keeps the one cache
    assert B._str_to_dict_path_full is parse
    for path in PATHS:
        assert parse(path) == parse.__wrapped__(path), path


def test_figures_built_with_magic_underscores_equal_nested_dicts_and_hit_the_cache():
    def magic():
        fig = go.Figure(go.Heatmap(z=[[1, 2], [3, 4]], colorbar_title_text="p"))
        fig.update_layout(xaxis_title_text="key", yaxis_autorange="reversed", margin_l=10, title_font_size=14)
        return fig

    nested = go.Figure(go.Heatmap(z=[[1, 2], [3, 4]], colorbar=dict(title=dict(text="p"))))
    nested.update_layout(xaxis=dict(title=dict(text="key")), yaxis=dict(autorange="reversed"), margin=dict(l=10),
                         title=dict(font=dict(size=14)))
    first = magic()
    hits = B._str_to_dict_path_full.cache_info().hits
    assert magic().to_plotly_json() == first.to_plotly_json() == nested.to_plotly_json()
    assert B._str_to_dict_path_full.cache_info().hits > hits
