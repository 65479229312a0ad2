"""Drives kart's trajectory viewer in Debian's headless Chromium (through its chromedriver) for
tests/tests/viewer.rs, and prints what it saw as JSON; screenshots of each page go to OUT.

    browse.py URL TOKENIZER_JSON OUT

URL is the viewer's page (http://HOST:PORT/ui/). Every wait polls the page up to a deadline.
"""

import json
import sys
import time
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select
from tokenizers import Tokenizer

DEADLINE = 300


def until(what, check):
    """Polls `check` until it returns something truthy; fails naming `what` after DEADLINE s."""
    started = time.monotonic()
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() - started > DEADLINE:
            raise SystemExit(f"viewer: {what}: not within {DEADLINE} s")
        time.sleep(0.1)


def main(url, tokenizer_json, out):
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in [
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=1400,1000",
    ]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    report = {}
    try:
        report = browse(driver, url, tokenizer_json, out)
        report["console"] = [
            {"level": e["level"], "message": e["message"]} for e in driver.get_log("browser")
        ]
    finally:
        driver.quit()
    print(json.dumps(report))


def rows(driver, table):
    return driver.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr")


def listed(driver):
    """The list's rows as dicts of their cells."""
    names = ["step", "reward", "env", "role", "tools", "turns", "stale", "id"]
    return [
        dict(zip(names, (c.text for c in r.find_elements(By.TAG_NAME, "td")))) for r in rows(driver, "list")
    ]


def count(driver):
    text = driver.find_element(By.ID, "count").text
    return int(text.split()[0]) if text else None


def change_filter(driver, set_it):
    """Applies a filter and waits for the list to be drawn again."""
    driver.execute_script("document.getElementById('count').textContent = ''")
    set_it()
    until("the list after a filter", lambda: count(driver) is not None)
    return count(driver), listed(driver)


def browse(driver, url, tokenizer_json, out):
    report = {}
    driver.get(url)
    until("the steps table", lambda: rows(driver, "steps"))
    until("the list", lambda: count(driver) is not None and rows(driver, "list"))
    report["steps"] = [int(r.get_attribute("data-step")) for r in rows(driver, "steps")]
    report["total"] = count(driver)
    report["first_page"] = len(rows(driver, "list"))
    driver.save_screenshot(f"{out}/steps-and-list.png")

    step = Select(driver.find_element(By.ID, "f-step"))
    last = report["steps"][-1]
    n, items = change_filter(driver, lambda: step.select_by_value(str(last)))
    report["step_filter"] = {"step": last, "total": n, "steps_listed": sorted({int(i["step"]) for i in items})}

    tool = Select(driver.find_element(By.ID, "f-tool"))
    tools = [o.get_attribute("value") for o in tool.options if o.get_attribute("value")]
    report["tools"] = tools
    if tools:
        n, items = change_filter(driver, lambda: tool.select_by_value(tools[0]))
        report["tool_filter"] = {"tool": tools[0], "total": n, "tools_listed": [i["tools"] for i in items]}
        driver.save_screenshot(f"{out}/filtered.png")
        n, items = change_filter(driver, lambda: tool.select_by_value(""))

    # The best reward of the run as the lowest kept, over every step.
    n, items = change_filter(driver, lambda: step.select_by_value(""))
    steps = fetch(url, "api/summary")["steps"]
    report["reward_range"] = [min(s["reward_min"] for s in steps), max(s["reward_max"] for s in steps)]
    threshold = report["reward_range"][1]
    box = driver.find_element(By.ID, "f-min-reward")

    def set_min():
        box.clear()
        box.send_keys(str(threshold))
        driver.execute_script("arguments[0].dispatchEvent(new Event('change'))", box)

    n, items = change_filter(driver, set_min)
    report["reward_filter"] = {"min": threshold, "total": n, "rewards_listed": [float(i["reward"]) for i in items]}
    n, items = change_filter(driver, lambda: driver.find_element(By.ID, "clear").click())
    report["cleared_total"] = n

    # The trajectory with the most segments on the first page: its conversation as drawn, against
    # its tokens decoded.
    picked = max(
        (r.get_attribute("data-line") for r in rows(driver, "list")[:20]),
        key=lambda line: len(fetch(url, f"api/trajectories/{line}")["segments"]),
    )
    driver.find_element(By.CSS_SELECTOR, f'#list tbody tr[data-line="{picked}"]').click()
    until("the trajectory", lambda: driver.find_element(By.ID, "detail").get_attribute("data-line") == picked)
    segments = driver.find_elements(By.CSS_SELECTOR, "#detail .conversation .segment")
    shown = "".join(s.find_element(By.CLASS_NAME, "text").get_attribute("textContent") for s in segments)
    trajectory = fetch(url, f"api/trajectories/{picked}")
    tokenizer = Tokenizer.from_file(tokenizer_json)
    decoded = tokenizer.decode(trajectory["trajectory"]["token_ids"], skip_special_tokens=False)
    report["detail"] = {
        "line": picked,
        "text_equals_decoded": shown == decoded,
        "shown_chars": len(shown),
        "decoded_chars": len(decoded),
        "roles": [s.get_attribute("data-role") for s in segments],
        "model_classes": [s.get_attribute("class") for s in segments if s.get_attribute("data-role") == "model"],
        "marks": len(driver.find_elements(By.CSS_SELECTOR, "#detail mark")),
        "meta": driver.find_element(By.CSS_SELECTOR, "#detail .meta").text,
    }
    driver.save_screenshot(f"{out}/trajectory.png")

    driver.find_element(By.ID, "show-group").click()
    until("the group", lambda: driver.find_elements(By.CSS_SELECTOR, "#group-columns .column"))
    columns = driver.find_elements(By.CSS_SELECTOR, "#group-columns .column")
    report["group"] = {
        "columns": len(columns),
        "prompt_id": trajectory["prompt_id"],
        "step": trajectory["step"],
        "lines": [c.get_attribute("data-line") for c in columns],
    }
    driver.save_screenshot(f"{out}/group.png")
    return report


def fetch(url, path):
    with urllib.request.urlopen(url + path, timeout=DEADLINE) as answer:
        return json.load(answer)


if __name__ == "__main__":
    main(*sys.argv[1:])
